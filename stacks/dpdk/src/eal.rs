//! The EAL, once per process.

use std::ffi::{CStr, CString};
use std::io;
use std::sync::OnceLock;

use crate::sys;

/// The initialised environment abstraction layer. DPDK allows one
/// initialisation per process; [`Eal::init`] keeps it for the process's
/// life.
#[derive(Debug)]
pub struct Eal {
    args: Vec<String>,
}

static EAL: OnceLock<Result<Eal, String>> = OnceLock::new();

/// The text of a DPDK error number.
pub(crate) fn error(what: &str, errno: i32) -> io::Error {
    // SAFETY: rte_strerror returns a static string for any number.
    let text = unsafe { CStr::from_ptr(sys::rte_strerror(errno)) };
    io::Error::other(format!("{what}: {} ({errno})", text.to_string_lossy()))
}

/// The calling thread's `rte_errno`.
pub(crate) fn errno() -> i32 {
    // SAFETY: reads a thread-local.
    unsafe { sys::up_errno() }
}

impl Eal {
    /// Initialises the EAL with `args` (as on a DPDK command line, without
    /// the program name) the first time; later calls return the same EAL
    /// and fail if their arguments differ.
    pub fn init(args: &[&str]) -> io::Result<&'static Eal> {
        let want: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let r = EAL.get_or_init(|| {
            let mut argv: Vec<CString> = vec![CString::new("uniplane").unwrap_or_default()];
            for a in &want {
                argv.push(CString::new(a.as_str()).map_err(|e| e.to_string())?);
            }
            // rte_eal_init may keep and permute the pointers: leak them.
            let argv: &'static mut [*mut libc::c_char] = Box::leak(
                argv.into_iter()
                    .map(CString::into_raw)
                    .collect::<Vec<_>>()
                    .into_boxed_slice(),
            );
            // SAFETY: argc/argv describe live C strings for the process's life.
            let rc = unsafe { sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
            if rc < 0 {
                return Err(error("rte_eal_init", errno()).to_string());
            }
            Ok(Eal { args: want.clone() })
        });
        match r {
            Ok(eal) if eal.args == want => Ok(eal),
            Ok(eal) => Err(io::Error::other(format!(
                "the EAL is already initialised with {:?}",
                eal.args
            ))),
            Err(e) => Err(io::Error::other(e.clone())),
        }
    }

    /// The arguments it was initialised with.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// The calling thread's lcore id; `None` outside EAL threads, which
    /// get no per-lcore mempool cache.
    pub fn lcore_id(&self) -> Option<u32> {
        // SAFETY: reads a thread-local.
        let id = unsafe { sys::up_lcore_id() };
        (id != u32::MAX).then_some(id)
    }

    /// Ports DPDK found (devices and vdevs).
    pub fn port_count(&self) -> u16 {
        // SAFETY: the EAL is initialised.
        unsafe { sys::rte_eth_dev_count_avail() }
    }
}
