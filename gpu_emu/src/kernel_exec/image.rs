//! The module images of the emulated NVRTC, in two forms:
//!
//! - "PTX" (`nvrtcGetPTX`): a short text naming the compiled shared object and listing
//!   the target and the kernels it registers in PTX's words (`.target sm_90`,
//!   `.entry name(`), so a check that a kernel is defined reads the same as with real
//!   PTX. Text without NUL bytes, self-delimiting (the engine hands it on as a C string).
//! - "CUBIN" (`nvrtcGetCUBIN`): the compiled x86-64 ELF shared object itself, whole; its
//!   length follows from its ELF header. Loading writes it (content-addressed) to the
//!   cache directory and opens it.
//!
//! ```text
//! DCPEMU-MODULE 1
//! so <byte length of the path>
//! <path>
//! .target sm_90
//! .entry fill_f32(
//! end
//! ```

const MAGIC: &[u8] = b"DCPEMU-MODULE 1\n";
/// The longest text image read (a guard against reading on through foreign bytes).
const MAX_TEXT: usize = 1 << 20;
/// The largest ELF image accepted.
const MAX_ELF: u64 = 1 << 30;

/// The text image for the shared object at `so_path`, compiled for `arch` (the number of
/// `sm_XY`) with `entries` registered; NUL-terminated.
pub fn encode(so_path: &str, arch: u32, entries: &[String]) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + so_path.len() + 24 * entries.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(
        format!("so {}\n{so_path}\n.target sm_{arch}\n", so_path.len()).as_bytes(),
    );
    for e in entries {
        out.extend_from_slice(format!(".entry {e}(\n").as_bytes());
    }
    out.extend_from_slice(b"end\n\0");
    out
}

/// Where a module's code is.
#[derive(Debug)]
pub enum Source<'a> {
    /// A shared object in the cache (text image).
    Path(String),
    /// The shared object's bytes (ELF image).
    Elf(&'a [u8]),
}

/// Reads the image at `image`, reading no byte past it (and, for bytes of another
/// kind, none past the first that tells them apart).
///
/// # Safety
/// `image` points to an image of either form, or to readable bytes that differ from
/// both within their first 64 bytes.
pub unsafe fn decode<'a>(image: *const u8) -> Result<Source<'a>, String> {
    if image.is_null() {
        return Err("module image is a null pointer".into());
    }
    // SAFETY: bytes are read one at a time, each only after the previous matched.
    let byte = |i: usize| unsafe { *image.add(i) };
    if (0..4).all(|i| byte(i) == b"\x7fELF"[i]) {
        // SAFETY: an ELF header is 64 bytes.
        return unsafe { decode_elf(image) };
    }
    for (i, &m) in MAGIC.iter().enumerate() {
        if byte(i) != m {
            return Err("module image is neither an emulated module's text nor its ELF (PTX or a CUBIN of a real GPU?): the emulated driver loads only images of the emulated NVRTC".into());
        }
    }
    let mut pos = MAGIC.len();
    for &m in b"so " {
        if byte(pos) != m {
            return Err("module image: malformed header".into());
        }
        pos += 1;
    }
    let mut len = 0usize;
    let mut digits = 0;
    while byte(pos).is_ascii_digit() && digits < 12 {
        len = len * 10 + usize::from(byte(pos) - b'0');
        pos += 1;
        digits += 1;
    }
    if digits == 0 || byte(pos) != b'\n' || len > 4096 {
        return Err("module image: malformed path length".into());
    }
    pos += 1;
    let path: Vec<u8> = (0..len).map(|i| byte(pos + i)).collect();
    pos += len;
    // The listing, up to the closing "end" line.
    let mut line_start = pos;
    loop {
        match byte(pos) {
            0 => return Err("module image: truncated".into()),
            b'\n' => {
                if pos - line_start == 3 && (0..3).all(|i| byte(line_start + i) == b"end"[i]) {
                    break;
                }
                line_start = pos + 1;
            }
            _ => {}
        }
        pos += 1;
        if pos > MAX_TEXT {
            return Err("module image: no end line".into());
        }
    }
    String::from_utf8(path)
        .map(Source::Path)
        .map_err(|_| "module image: path is not UTF-8".into())
}

/// An ELF image: only an x86-64 shared object (what the emulated NVRTC makes) is
/// accepted; its length is where its section or program headers end.
unsafe fn decode_elf<'a>(image: *const u8) -> Result<Source<'a>, String> {
    // SAFETY: the caller's contract (an ELF header of 64 bytes).
    let header = unsafe { std::slice::from_raw_parts(image, 64) };
    let u16_at = |o: usize| u64::from(u16::from_le_bytes([header[o], header[o + 1]]));
    let u64_at = |o: usize| u64::from_le_bytes(header[o..o + 8].try_into().unwrap_or_default());
    let (class, data, e_type, machine) = (header[4], header[5], u16_at(16), u16_at(18));
    if machine == 190 {
        return Err("module image is a CUBIN of a real GPU (EM_CUDA): the emulated device runs only the emulated NVRTC's images".into());
    }
    if class != 2 || data != 1 || e_type != 3 || machine != 62 {
        return Err(format!(
            "module image is an ELF but not an x86-64 shared object (class {class}, type {e_type}, machine {machine})"
        ));
    }
    let (phoff, shoff) = (u64_at(32), u64_at(40));
    let (phentsize, phnum, shentsize, shnum) = (u16_at(54), u16_at(56), u16_at(58), u16_at(60));
    let end = (phoff + phentsize * phnum).max(shoff + shentsize * shnum);
    if !(64..=MAX_ELF).contains(&end) {
        return Err(format!("module image: implausible ELF length {end}"));
    }
    // SAFETY: the object is `end` bytes long (its headers lie within it).
    Ok(Source::Elf(unsafe {
        std::slice::from_raw_parts(image, end as usize)
    }))
}

#[cfg(test)]
mod tests {
    use super::{decode, encode, Source};

    #[test]
    fn round_trip_and_refusals() {
        let img = encode("/tmp/x y.so", 90, &["k1".into(), "k2".into()]);
        assert!(!img[..img.len() - 1].contains(&0));
        let text = String::from_utf8_lossy(&img);
        assert!(text.contains(".target sm_90\n.entry k1(\n.entry k2(\nend\n"));
        match unsafe { decode(img.as_ptr()) }.unwrap() {
            Source::Path(p) => assert_eq!(p, "/tmp/x y.so"),
            other => panic!("{other:?}"),
        }
        let mut cubin = [0u8; 64];
        cubin[..4].copy_from_slice(b"\x7fELF");
        cubin[18] = 190;
        assert!(unsafe { decode(cubin.as_ptr()) }
            .unwrap_err()
            .contains("EM_CUDA"));
        let ptx = b".version 8.0\0";
        assert!(unsafe { decode(ptx.as_ptr()) }.is_err());
        let cut = b"DCPEMU-MODULE 1\nso 4\n/a.s\0";
        assert!(unsafe { decode(cut.as_ptr()) }.is_err());
    }
}
