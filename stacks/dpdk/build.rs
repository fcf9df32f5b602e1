//! With the `dpdk` feature: finds DPDK through pkg-config, generates the
//! bindings with bindgen and compiles the C shim. Without it: nothing.

fn main() {
    println!("cargo:rerun-if-changed=csrc/shim.h");
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "dpdk")]
    dpdk::build();
}

#[cfg(feature = "dpdk")]
mod dpdk {
    use std::path::PathBuf;
    use std::process::Command;

    fn pkg_config(arg: &str) -> Vec<String> {
        let out = Command::new("pkg-config")
            .args([arg, "libdpdk"])
            .output()
            .unwrap_or_else(|e| {
                panic!("pkg-config not found ({e}); install pkg-config and libdpdk-dev")
            });
        if !out.status.success() {
            panic!(
                "pkg-config cannot find libdpdk: {}\ninstall libdpdk-dev (DPDK 22.11)",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    pub fn build() {
        let cflags = pkg_config("--cflags");
        let libs = pkg_config("--libs");

        let mut cc = cc::Build::new();
        cc.file("csrc/shim.c").opt_level(3).warnings(false);
        for f in &cflags {
            cc.flag(f);
        }
        cc.compile("uniplane_dpdk_shim");

        for l in &libs {
            if let Some(dir) = l.strip_prefix("-L") {
                println!("cargo:rustc-link-search=native={dir}");
            }
        }
        for lib in ["rte_ethdev", "rte_mbuf", "rte_mempool", "rte_eal"] {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }

        let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
        bindgen::Builder::default()
            .header("csrc/shim.h")
            .clang_args(&cflags)
            .allowlist_function("up_.*")
            .allowlist_function("rte_eal_init")
            .allowlist_function("rte_eal_cleanup")
            .allowlist_function("rte_strerror")
            .allowlist_function("rte_socket_id")
            .allowlist_function("rte_eth_dev_count_avail")
            .allowlist_function("rte_eth_dev_get_port_by_name")
            .allowlist_function("rte_eth_dev_configure")
            .allowlist_function("rte_eth_dev_socket_id")
            .allowlist_function("rte_eth_rx_queue_setup")
            .allowlist_function("rte_eth_tx_queue_setup")
            .allowlist_function("rte_eth_dev_start")
            .allowlist_function("rte_eth_dev_stop")
            .allowlist_function("rte_eth_dev_close")
            .allowlist_function("rte_eth_macaddr_get")
            .allowlist_function("rte_eth_dev_get_mtu")
            .allowlist_function("rte_eth_promiscuous_enable")
            .allowlist_function("rte_eth_stats_get")
            .allowlist_function("rte_pktmbuf_pool_create")
            .allowlist_function("rte_mempool_free")
            .allowlist_type("rte_eth_conf")
            .allowlist_type("rte_eth_stats")
            .allowlist_type("rte_ether_addr")
            .opaque_type("rte_mbuf")
            .opaque_type("rte_mempool")
            .derive_default(true)
            .layout_tests(false)
            .generate_comments(false)
            .generate()
            .expect("bindgen could not read the DPDK headers (is libclang-dev installed?)")
            .write_to_file(out.join("bindings.rs"))
            .expect("cannot write bindings");
    }
}
