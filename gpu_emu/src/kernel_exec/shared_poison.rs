//! Static `__shared__` variables are `thread_local` in the module's shared object (every
//! thread of a block runs on one OS thread). On a GPU a block's shared memory starts with
//! whatever was there, so before each block the module's whole TLS block (which holds
//! nothing but those variables) is filled with 0xFF bytes: a kernel that reads shared
//! memory it has not written reads NaN / -1 instead of a friendly zero or the previous
//! block's values.

use std::ffi::{c_int, c_void, CStr};

/// A module's TLS block: its module id and size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TlsBlock {
    modid: usize,
    size: usize,
}

#[repr(C)]
struct TlsIndex {
    module: usize,
    offset: usize,
}

extern "C" {
    fn dlinfo(handle: *mut c_void, request: c_int, info: *mut c_void) -> c_int;
    fn __tls_get_addr(index: *const TlsIndex) -> *mut c_void;
}

/// glibc's RTLD_DI_TLS_MODID.
const RTLD_DI_TLS_MODID: c_int = 9;
const PT_TLS: u32 = 7;

struct Search<'a> {
    path: &'a CStr,
    size: usize,
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info; data is our Search.
    let (info, search) = unsafe { (&*info, &mut *data.cast::<Search<'_>>()) };
    // SAFETY: dlpi_name is a C string (possibly empty).
    if info.dlpi_name.is_null() || unsafe { CStr::from_ptr(info.dlpi_name) } != search.path {
        return 0;
    }
    for i in 0..usize::from(info.dlpi_phnum) {
        // SAFETY: dlpi_phnum headers at dlpi_phdr.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type == PT_TLS {
            search.size = ph.p_memsz as usize;
        }
    }
    1
}

impl TlsBlock {
    /// The TLS block of the module `handle` loaded from `path`, if it has one.
    ///
    /// # Safety
    /// `handle` is a live dlopen handle of `path`.
    pub(crate) unsafe fn of(handle: *mut c_void, path: &CStr) -> Option<TlsBlock> {
        let mut search = Search { path, size: 0 };
        // SAFETY: visit reads only what dl_iterate_phdr hands it.
        unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search<'_>).cast()) };
        if search.size == 0 {
            return None;
        }
        let mut modid: usize = 0;
        // SAFETY: a live handle; RTLD_DI_TLS_MODID writes a size_t.
        let r = unsafe { dlinfo(handle, RTLD_DI_TLS_MODID, (&mut modid as *mut usize).cast()) };
        (r == 0 && modid != 0).then_some(TlsBlock {
            modid,
            size: search.size,
        })
    }

    /// Fills the calling OS thread's instance of the block with 0xFF bytes.
    pub(crate) fn poison(&self) {
        let index = TlsIndex {
            module: self.modid,
            offset: 0,
        };
        // SAFETY: the module is loaded for good; __tls_get_addr allocates the calling
        // thread's block on first use and returns its start, `size` bytes long.
        unsafe {
            let base = __tls_get_addr(&index);
            if !base.is_null() {
                std::ptr::write_bytes(base.cast::<u8>(), 0xFF, self.size);
            }
        }
    }
}
