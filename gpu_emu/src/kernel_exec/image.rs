//! The "CUBIN" the emulated NVRTC returns: a short text naming the compiled shared
//! object. Text without NUL bytes, because the engine passes the same bytes as PTX (a C
//! string) or as a binary without a terminator; so it is self-delimiting.
//!
//! ```text
//! DCPEMU-MODULE 1
//! so <byte length of the path>
//! <path>
//! end
//! ```

const MAGIC: &[u8] = b"DCPEMU-MODULE 1\n";
const END: &[u8] = b"\nend\n";

/// The image for the shared object at `so_path`, NUL-terminated.
pub fn encode(so_path: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + so_path.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(format!("so {}\n", so_path.len()).as_bytes());
    out.extend_from_slice(so_path.as_bytes());
    out.extend_from_slice(END);
    out.push(0);
    out
}

/// The shared object's path from an image at `image`, reading no byte past the image
/// (and, for something else such as a real CUBIN or PTX text, no byte past the first
/// that differs from the magic).
///
/// # Safety
/// `image` points to readable bytes up to the first mismatch with the format.
pub unsafe fn decode(image: *const u8) -> Result<String, String> {
    if image.is_null() {
        return Err("module image is a null pointer".into());
    }
    // SAFETY: bytes are read one at a time, each only after the previous matched.
    let byte = |i: usize| unsafe { *image.add(i) };
    for (i, &m) in MAGIC.iter().enumerate() {
        if byte(i) != m {
            let what = if byte(0) == 0x7F {
                "an ELF (a real CUBIN?)"
            } else {
                "not an emulated module"
            };
            return Err(format!(
                "module image is {what}: the emulated driver loads only images of the emulated NVRTC"
            ));
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
    for (i, &m) in END.iter().enumerate() {
        if byte(pos + i) != m {
            return Err("module image: truncated".into());
        }
    }
    String::from_utf8(path).map_err(|_| "module image: path is not UTF-8".into())
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip_and_refusals() {
        let img = super::encode("/tmp/x y.so");
        assert!(!img[..img.len() - 1].contains(&0));
        assert_eq!(
            unsafe { super::decode(img.as_ptr()) }.unwrap(),
            "/tmp/x y.so"
        );
        let elf = b"\x7fELF\0\0\0";
        assert!(unsafe { super::decode(elf.as_ptr()) }
            .unwrap_err()
            .contains("ELF"));
        let ptx = b".version 8.0\0";
        assert!(unsafe { super::decode(ptx.as_ptr()) }.is_err());
    }
}
