//! Builds the Verilator models of `hw/rtl/uniplane_top.v` (and of
//! `hw/rtl/kernels/up_top_kernels.v`, the plane with kernels on two of its
//! ports) and the C shim the crate drives them through.
//!
//! Verilator 5.006 builds its runtime library only for `--exe` builds, so
//! this script compiles `verilated.cpp` and `verilated_threads.cpp` itself
//! (from the include directory `verilator --getenv VERILATOR_ROOT` names).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One model: its shim prefix, its top module, whether it needs the
/// kernels of `hw/rtl/kernels/`, and its parameter overrides.
struct ModelSpec {
    prefix: &'static str,
    top: &'static str,
    kernels: bool,
    params: &'static [&'static str],
}

/// The models.
const MODELS: &[ModelSpec] = &[
    ModelSpec {
        prefix: "up_n4",
        top: "uniplane_top",
        kernels: false,
        params: &["-GN=4", "-GVOQ_DEPTH=64", "-GVOQ_POOL=768"],
    },
    ModelSpec {
        prefix: "up_n8",
        top: "uniplane_top",
        kernels: false,
        params: &["-GN=8", "-GVOQ_DEPTH=32", "-GVOQ_POOL=768"],
    },
    ModelSpec {
        prefix: "up_n4i",
        top: "uniplane_top",
        kernels: false,
        params: &[
            "-GN=4",
            "-GVOQ_DEPTH=64",
            "-GVOQ_POOL=768",
            "-GMATCH=1",
            "-GITER=2",
            "-GPORTS=2",
        ],
    },
    ModelSpec {
        prefix: "up_n8i",
        top: "uniplane_top",
        kernels: false,
        params: &[
            "-GN=8",
            "-GVOQ_DEPTH=32",
            "-GVOQ_POOL=768",
            "-GMATCH=1",
            "-GITER=2",
            "-GPORTS=2",
        ],
    },
    ModelSpec {
        prefix: "up_k8",
        top: "up_top_kernels",
        kernels: true,
        params: &[
            "-GN=8",
            "-GVOQ_DEPTH=32",
            "-GVOQ_POOL=768",
            "-GECHO_PORT=6",
            "-GSUM_PORT=7",
        ],
    },
];

fn verilator_root() -> PathBuf {
    let out = Command::new("verilator")
        .args(["--getenv", "VERILATOR_ROOT"])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&o.stdout).trim().to_owned())
        }
        _ => panic!(
            "\n\nuniplane-hw-sim needs Verilator (5.006 or later) to build the RTL model, \
             and `verilator` is not on PATH.\nInstall it with `apt-get install verilator`, \
             or run ./scripts/test.sh, which installs it.\n\n"
        ),
    }
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let rtl = manifest.join("../rtl");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-changed=../rtl");
    println!("cargo:rerun-if-env-changed=PATH");

    let root = verilator_root();
    let include = root.join("include");
    let sources = verilog_in(&rtl);
    let kernel_sources = verilog_in(&rtl.join("kernels"));

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .debug(false)
        .warnings(false)
        .include(&include)
        .include(include.join("vltstd"))
        .include(manifest.join("csrc"))
        .define("VM_TRACE", "0")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-faligned-new")
        .file(include.join("verilated.cpp"))
        .file(include.join("verilated_threads.cpp"));

    for ModelSpec {
        prefix,
        top,
        kernels,
        params,
    } in MODELS
    {
        let class = format!("V{prefix}");
        let dir = out.join(&class);
        let _ = fs::remove_dir_all(&dir);
        let status = Command::new("verilator")
            .arg("--cc")
            .args(["--top-module", top, "--prefix", &class])
            .arg("-Mdir")
            .arg(&dir)
            .args([
                "-O3",
                "--x-assign",
                "fast",
                "--x-initial",
                "fast",
                "-Wno-fatal",
            ])
            .arg(format!("-I{}", rtl.display()))
            .args(*params)
            .args(&sources)
            .args(if *kernels { &kernel_sources[..] } else { &[] })
            .status()
            .expect("verilator runs");
        assert!(
            status.success(),
            "verilator failed on hw/rtl ({prefix}, {top})"
        );
        build.include(&dir);
        add_generated(&mut build, &dir);
        build.file(
            manifest
                .join("csrc")
                .join(format!("shim_{}.cpp", &prefix[3..])),
        );
    }
    build.compile("uniplane_top_models");
    println!("cargo:rustc-link-lib=stdc++");
    println!("cargo:rustc-link-lib=pthread");
}

/// The Verilog files directly in `dir`, sorted.
fn verilog_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .expect("the RTL directory exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "v"))
        .collect();
    files.sort();
    files
}

fn add_generated(build: &mut cc::Build, dir: &Path) {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .expect("verilator wrote its output")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cpp"))
        .collect();
    files.sort();
    for f in files {
        build.file(f);
    }
}
