//! The compile step of the emulated NVRTC: the source (its `extern __shared__`
//! rewritten) plus a generated trampoline table, compiled by the host C++ compiler into
//! a shared object in a cache directory keyed by a hash of everything that goes in.

use std::fmt::Write as _;
use std::process::Command;

use super::scan::{scan, KernelDecl};
use crate::cache::{cache_dir, hash_hex, unique_suffix, write_once};
use crate::kernel_exec::{image, SHARED_LIMIT};

/// The emulation headers, written next to each other into the cache.
const HEADERS: &[(&str, &str)] = &[
    ("dcpemu.h", include_str!("../../include/dcpemu.h")),
    (
        "dcpemu_vector.h",
        include_str!("../../include/dcpemu_vector.h"),
    ),
    (
        "dcpemu_float_formats.h",
        include_str!("../../include/dcpemu_float_formats.h"),
    ),
    ("cuda_bf16.h", include_str!("../../include/cuda_bf16.h")),
    ("cuda_fp16.h", include_str!("../../include/cuda_fp16.h")),
    ("cuda_fp8.h", include_str!("../../include/cuda_fp8.h")),
    ("assert.h", include_str!("../../include/assert.h")),
];

/// Changes whenever the generated code changes shape (part of the cache key).
const GENERATOR: &str = "dcpemu-gen-1";

/// Flags every compile uses: optimised, position independent, FMA contraction on as
/// NVRTC's default `--fmad=true` (results differ from an uncontracted host computation
/// by a few ulp, as the device's do), nothing exported but the table.
const BASE_FLAGS: &[&str] = &[
    "-O2",
    "-fPIC",
    "-shared",
    "-mfma",
    "-mavx2",
    "-fno-math-errno",
    "-fvisibility=hidden",
    "-fno-semantic-interposition",
    "-fstack-clash-protection",
    "-Wno-unused-function",
];

/// What a program's options ask of the host compiler.
#[derive(Debug, Default)]
pub struct Options {
    pub flags: Vec<String>,
    pub notes: Vec<String>,
    /// The XY of `sm_XY` / `compute_XY` (NVRTC's default: 75).
    pub arch: u32,
}

/// `sm_90`, `compute_90`, `sm_90a` → 90.
fn parse_arch(v: &str) -> Result<u32, String> {
    let digits = v
        .strip_prefix("sm_")
        .or_else(|| v.strip_prefix("compute_"))
        .unwrap_or("");
    let digits = digits.trim_end_matches(['a', 'f']);
    digits
        .parse::<u32>()
        .map_err(|_| format!("unknown GPU architecture {v:?}"))
}

/// Translates NVRTC options; an unknown one is an error (NVRTC_ERROR_INVALID_OPTION).
pub fn translate_options(opts: &[String]) -> Result<Options, String> {
    let mut out = Options {
        arch: 75,
        ..Options::default()
    };
    let mut std = "c++17".to_owned();
    let mut contract = true;
    let mut it = opts.iter().peekable();
    while let Some(o) = it.next() {
        let o = o.as_str();
        let value = |prefixes: &[&str]| prefixes.iter().find_map(|p| o.strip_prefix(p));
        if let Some(v) = value(&["--std=", "-std="]) {
            if !["c++03", "c++11", "c++14", "c++17", "c++20"].contains(&v) {
                return Err(format!("unsupported language standard {o}"));
            }
            std = v.to_owned();
        } else if let Some(v) = value(&["--fmad=", "-fmad="]) {
            contract = v == "true";
        } else if let Some(v) = value(&["--ftz=", "-ftz="]) {
            if v == "true" {
                out.notes
                    .push("--ftz=true: the emulator keeps subnormals (no flush to zero)".into());
            }
        } else if let Some(v) = value(&["--gpu-architecture=", "-arch="]) {
            out.arch = parse_arch(v)?;
        } else if o == "--gpu-architecture" || o == "-arch" {
            out.arch = parse_arch(it.next().map_or("", |s| s.as_str()))?;
        } else if value(&["--prec-div=", "-prec-div=", "--prec-sqrt=", "-prec-sqrt="]).is_some() {
        } else if let Some(v) = value(&["--define-macro=", "-D"]) {
            out.flags.push(format!("-D{v}"));
        } else if o == "--define-macro" {
            if let Some(v) = it.next() {
                out.flags.push(format!("-D{v}"));
            }
        } else if let Some(v) = value(&["--undefine-macro=", "-U"]) {
            out.flags.push(format!("-U{v}"));
        } else if let Some(v) = value(&["--include-path=", "-I"]) {
            out.flags.push(format!("-I{v}"));
        } else if o == "--use_fast_math" || o == "-use_fast_math" {
            out.notes.push(format!(
                "{o}: fast-math intrinsics are the exact libm functions here"
            ));
        } else if o == "-w" || o == "--disable-warnings" {
            out.flags.push("-w".into());
        } else if [
            "-lineinfo",
            "--generate-line-info",
            "-G",
            "--device-debug",
            "-dopt",
            "--dopt=on",
            "-default-device",
            "--device-as-default-execution-space",
            "-rdc=false",
            "--relocatable-device-code=false",
            "--extra-device-vectorization",
            "-extra-device-vectorization",
            "--restrict",
            "-restrict",
        ]
        .contains(&o)
        {
        } else {
            return Err(format!(
                "option {o:?} is not supported by the emulated NVRTC"
            ));
        }
    }
    out.flags.push(format!("-std={std}"));
    out.flags.push(format!(
        "-ffp-contract={}",
        if contract { "fast" } else { "off" }
    ));
    Ok(out)
}

/// A compiled program: the image to hand out and the compiler's messages.
pub struct Compiled {
    /// The shared object in the cache.
    pub so_path: String,
    /// The kernels it registers.
    pub entries: Vec<String>,
    pub log: String,
}

impl Compiled {
    /// The text image ("PTX") for `arch`.
    pub fn text_image(&self, arch: u32) -> Vec<u8> {
        image::encode(&self.so_path, arch, &self.entries)
    }
}

/// Why a compile failed.
#[derive(Debug)]
pub enum CompileError {
    /// The source does not compile: the compiler's log.
    Source(String),
    /// The emulator could not run the compiler (cache, process): what went wrong.
    Internal(String),
}

impl From<String> for CompileError {
    fn from(e: String) -> Self {
        CompileError::Internal(e)
    }
}

impl From<&str> for CompileError {
    fn from(e: &str) -> Self {
        CompileError::Internal(e.to_owned())
    }
}

/// The trampolines and the table the loader reads, appended to the source.
fn trampolines(kernels: &[KernelDecl], notes: &mut Vec<String>) -> String {
    let mut out = String::from("\n#line 1 \"<dcpemu trampolines>\"\n");
    let _ = writeln!(
        out,
        "extern \"C\" __attribute__((visibility(\"default\"))) const unsigned int dcpemu_abi_version = {};",
        crate::kernel_exec::ABI_VERSION
    );
    out.push_str("namespace dcpemu_gen {\n");
    let mut rows = Vec::new();
    for (i, k) in kernels.iter().enumerate() {
        if !k.extern_c || k.templated {
            notes.push(format!(
                "kernel {} is not a plain extern \"C\" kernel: not registered (launch only extern \"C\" kernels)",
                k.name
            ));
            continue;
        }
        let shared = if k.shared_sizes.is_empty() {
            "0".to_owned()
        } else {
            k.shared_sizes.join(" + ")
        };
        let bounds = k.launch_bounds.clone().unwrap_or_else(|| "1024".into());
        let name = &k.name;
        let _ = writeln!(
            out,
            "static void entry_{i}(void** p) {{ ::dcpemu::invoke(&::{name}, p); }}"
        );
        let _ = writeln!(
            out,
            "using sig_{i} = decltype(::dcpemu::signature_of(&::{name}));"
        );
        let _ = writeln!(out, "constexpr unsigned long long shared_{i} = {shared};");
        let _ = writeln!(
            out,
            "static_assert(shared_{i} <= {SHARED_LIMIT}ull, \"kernel {name} uses more than 48 KiB of static shared memory (ptxas would refuse it)\");"
        );
        let _ = writeln!(
            out,
            "static_assert((unsigned long long)({bounds}) >= 1 && (unsigned long long)({bounds}) <= 1024, \"kernel {name}: __launch_bounds__ outside 1..=1024\");"
        );
        rows.push(format!(
            "    {{\"{name}\", &dcpemu_gen::entry_{i}, dcpemu_gen::sig_{i}::count, dcpemu_gen::sig_{i}::sizes, dcpemu_gen::sig_{i}::pointers, dcpemu_gen::shared_{i}, (unsigned int)({bounds})}},"
        ));
    }
    out.push_str("} // namespace dcpemu_gen\n");
    let count = rows.len();
    if rows.is_empty() {
        rows.push("    {\"\", nullptr, 0, nullptr, nullptr, 0, 0},".into());
    }
    let _ = writeln!(
        out,
        "extern \"C\" __attribute__((visibility(\"default\"))) const dcpemu_kernel_info dcpemu_kernels[] = {{\n{}\n}};",
        rows.join("\n")
    );
    let _ = writeln!(
        out,
        "extern \"C\" __attribute__((visibility(\"default\"))) const unsigned int dcpemu_kernel_count = {count};"
    );
    out
}

/// The host C++ compiler: `$DCPEMU_CXX`, else `c++`.
fn compiler() -> String {
    std::env::var("DCPEMU_CXX")
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "c++".into())
}

/// Compiles `src` (named `name`, with the program's extra `headers`) under `options`.
pub fn compile(
    src: &str,
    name: &str,
    headers: &[(String, String)],
    options: &Options,
) -> Result<Compiled, CompileError> {
    let scanned = scan(src);
    let mut notes = options.notes.clone();
    let tramp = trampolines(&scanned.kernels, &mut notes);
    let entries: Vec<String> = scanned
        .kernels
        .iter()
        .filter(|k| k.extern_c && !k.templated)
        .map(|k| k.name.clone())
        .collect();
    let file_name = name.replace(['"', '\\', '\n'], "_");
    let tu = format!("#line 1 \"{file_name}\"\n{}\n{tramp}", scanned.rewritten);

    let dir = cache_dir();
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("creating the cache {}: {e}", dir.display()))?;
    let header_bytes: Vec<&[u8]> = HEADERS
        .iter()
        .flat_map(|(n, t)| [n.as_bytes(), t.as_bytes()])
        .collect();
    let inc = dir.join(format!("include-{}", &hash_hex(&header_bytes)[..16]));
    std::fs::create_dir_all(&inc).map_err(|e| format!("creating {}: {e}", inc.display()))?;
    for (n, t) in HEADERS {
        write_once(&inc.join(n), t.as_bytes())?;
    }
    let compiler = compiler();
    let mut key_parts: Vec<&[u8]> = vec![GENERATOR.as_bytes(), compiler.as_bytes(), tu.as_bytes()];
    key_parts.extend(header_bytes.iter().copied());
    key_parts.extend(options.flags.iter().map(|f| f.as_bytes()));
    for (n, t) in headers {
        key_parts.push(n.as_bytes());
        key_parts.push(t.as_bytes());
    }
    let key = hash_hex(&key_parts);
    let so = dir.join(format!("{key}.so"));
    let so_text = so.to_str().ok_or("cache path is not UTF-8")?.to_owned();
    let note_log = notes.join("\n");
    if so.exists() {
        return Ok(Compiled {
            so_path: so_text,
            entries,
            log: note_log,
        });
    }
    let mut cmd = Command::new(&compiler);
    cmd.args(BASE_FLAGS).args(&options.flags);
    if !headers.is_empty() {
        let hdr_dir = dir.join(format!("headers-{key}"));
        for (n, t) in headers {
            if n.contains("..") || n.starts_with('/') {
                return Err(CompileError::Source(format!(
                    "header name {n:?} must be a relative path without .."
                )));
            }
            let p = hdr_dir.join(n);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("creating {}: {e}", parent.display()))?;
            }
            write_once(&p, t.as_bytes())?;
        }
        cmd.arg("-I").arg(&hdr_dir);
    }
    let cu = dir.join(format!("{key}.cu"));
    write_once(&cu, tu.as_bytes())?;
    let tmp_so = dir.join(format!("{key}.so.{}", unique_suffix()));
    cmd.arg("-I")
        .arg(&inc)
        .arg("-include")
        .arg("dcpemu.h")
        .arg("-x")
        .arg("c++")
        .arg(&cu)
        .arg("-o")
        .arg(&tmp_so);
    let out = cmd
        .output()
        .map_err(|e| format!("running the host compiler {compiler:?}: {e}"))?;
    let log = format!("{note_log}{}", String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp_so);
        return Err(CompileError::Source(log));
    }
    std::fs::rename(&tmp_so, &so).map_err(|e| format!("renaming to {}: {e}", so.display()))?;
    Ok(Compiled {
        so_path: so_text,
        entries,
        log,
    })
}
