//! Which forwarding plane the daemon runs on, and opening it: the software
//! engine, or the simulated RTL under `hw/` (cargo feature `rtl`). Either
//! way the daemon gets one `Arc<dyn PlaneHandle>` and programs it with the
//! same batched `PlaneOp`s.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use uniplane_overlay::{spawn_sharded, Engine, EngineConfig, PlaneHandle, RunMode, ShardConfig};

use crate::config::{Config, DeviceConfig, EngineMode, KernelBackend, KernelFunction};

/// The error `open_plane` gives for [`PlaneKind::Rtl`] in a build without
/// the `rtl` feature.
pub const NO_RTL: &str = "uniplaned was built without the RTL plane; rebuild with: \
cargo run --release -p uniplane-services --features rtl --bin uniplaned -- --plane rtl \
(needs Verilator)";

/// A forwarding plane the daemon can run on (`--plane`, or `plane = ` at
/// the top of the configuration file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PlaneKind {
    /// The software engine (`uniplane_overlay::Engine`) on its own thread.
    #[default]
    Engine,
    /// The Verilated `uniplane_top` (`uniplane_hw_sim::RtlPlane`) on its
    /// own thread, programmed through its register map.
    Rtl,
}

impl PlaneKind {
    /// The name it is given by: `engine` or `rtl`.
    pub fn as_str(self) -> &'static str {
        match self {
            PlaneKind::Engine => "engine",
            PlaneKind::Rtl => "rtl",
        }
    }
}

impl fmt::Display for PlaneKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A plane name that is neither `engine` nor `rtl`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown plane `{0}`: expected \"engine\" or \"rtl\"")]
pub struct UnknownPlane(pub String);

impl FromStr for PlaneKind {
    type Err = UnknownPlane;

    fn from_str(s: &str) -> Result<PlaneKind, UnknownPlane> {
        match s {
            "engine" => Ok(PlaneKind::Engine),
            "rtl" => Ok(PlaneKind::Rtl),
            other => Err(UnknownPlane(other.to_owned())),
        }
    }
}

/// The RTL port of the kernel model (`uniplane_hw_sim::Model::N8Kernels`)
/// the kernel computing `function` sits on: echo on port 6, sum32 on 7.
/// Kept here, checked against the model's constants where the model is
/// built, so a build without the `rtl` feature can check a configuration.
pub fn rtl_kernel_port(function: KernelFunction) -> Option<u16> {
    match function {
        KernelFunction::Echo => Some(6),
        KernelFunction::Sum32 => Some(7),
        _ => None,
    }
}

/// Ports of the kernel model, kernels' included.
pub const RTL_KERNEL_MODEL_PORTS: usize = 8;

/// Ports of the kernel model that are the host's: all but the two
/// kernels' (ports 0 to 5).
pub const RTL_KERNEL_HOST_PORTS: usize = RTL_KERNEL_MODEL_PORTS - 2;

/// The `backend = "rtl"` kernel devices of `config`, with their RTL ports.
pub fn rtl_kernels(config: &Config) -> impl Iterator<Item = (&DeviceConfig, u16)> {
    config.devices.iter().filter_map(|d| {
        let k = d
            .kernel
            .filter(|_| d.kernel_backend == KernelBackend::Rtl)?;
        Some((d, rtl_kernel_port(k.function)?))
    })
}

/// Whether `config` can run on `plane` as far as its kernel devices go:
/// a `backend = "rtl"` kernel needs the RTL plane, one device per RTL
/// kernel, and the kernel model's six host ports must hold the daemon's
/// own port, the other devices' and at least one application's (what is
/// left goes to further applications and to tunnels, attached as they
/// come). The reason when not (`uniplaned --check` and the start both
/// ask).
pub fn check_kernels(config: &Config, plane: PlaneKind) -> Result<(), String> {
    let mut seen: Vec<(&str, u16)> = Vec::new();
    for (d, port) in rtl_kernels(config) {
        if plane != PlaneKind::Rtl {
            return Err(format!(
                "device `{}`: a `backend = \"rtl\"` kernel runs on the RTL plane, \
                 not on {}: start with --plane rtl (or plane = \"rtl\")",
                d.name, plane
            ));
        }
        if let Some((other, _)) = seen.iter().find(|(_, p)| *p == port) {
            return Err(format!(
                "device `{}`: the RTL has one {} kernel (port {port}), already device `{other}`",
                d.name,
                d.kernel.map(|k| k.function.name()).unwrap_or_default()
            ));
        }
        seen.push((&d.name, port));
    }
    if seen.is_empty() {
        return Ok(());
    }
    // The kernels' ports carry nothing else; the rest is the host's.
    let host_ports = RTL_KERNEL_HOST_PORTS;
    let others = config.devices.len() - seen.len();
    // The daemon's own port, one per other device, one application.
    let needed = 1 + others + 1;
    if needed > host_ports {
        return Err(format!(
            "the RTL plane with kernels has {host_ports} ports besides its kernels' \
             ({RTL_KERNEL_MODEL_PORTS} in all), and this daemon needs {needed}: \
             its own, {others} for its other devices and one for an application \
             (the rest are for further applications and tunnels)"
        ));
    }
    Ok(())
}

/// How the plane's thread waits when idle, from the configuration.
fn run_mode(config: &Config) -> RunMode {
    match config.mode {
        EngineMode::BusyPoll => RunMode::BusyPoll,
        EngineMode::SpinThenPark => RunMode::SpinThenPark { spins: 2048 },
    }
}

/// Starts the plane of `kind` on a thread of its own, sized and run as
/// `config` says, and returns its handle.
///
/// - `Engine`: the software engine with `max_ports`, `ring_depth`,
///   `voq_depth` and `table_capacity` from the configuration; on `shards`
///   threads (pinned to `cpus`) when more than one is asked for (or CPUs
///   are named), else on one thread as the daemon has always run it.
/// - `Rtl`: the 8-port `uniplane_top` model; `ring_depth` sizes the port
///   rings, while ports, queues and tables are fixed by the RTL (8 ports,
///   32-beat queues, 32 forwarding entries per port). With `backend =
///   "rtl"` kernel devices configured, the 8-port model with the echo
///   kernel on port 6 and the sum32 kernel on port 7 instead, each
///   kernel's port kept for its device and ports 0 to 5 the host's
///   ([`check_kernels`] says what fits). Without the `rtl` feature this is the error [`NO_RTL`].
pub fn open_plane(kind: PlaneKind, config: &Config) -> Result<Arc<dyn PlaneHandle>, String> {
    check_kernels(config, kind)?;
    match kind {
        PlaneKind::Engine => {
            let engine = EngineConfig {
                max_ports: config.max_ports,
                ring_depth: config.ring_depth,
                voq_depth: config.voq_depth,
                table_capacity: config.table_capacity,
                ..EngineConfig::default()
            };
            if config.shards == 1 && config.cpus.is_empty() {
                return Ok(Arc::new(Engine::new(engine).spawn(run_mode(config))));
            }
            let shards = ShardConfig {
                shards: config.shards,
                cpus: config.cpus.clone(),
            };
            spawn_sharded(engine, &shards, run_mode(config))
                .map(|h| Arc::new(h) as Arc<dyn PlaneHandle>)
                .map_err(|e| format!("the engine's shards: {e}"))
        }
        PlaneKind::Rtl => open_rtl(config),
    }
}

#[cfg(feature = "rtl")]
fn open_rtl(config: &Config) -> Result<Arc<dyn PlaneHandle>, String> {
    use uniplane_hw_sim::{Model, RtlPlane, RtlPlaneConfig};
    let kernels: Vec<(&DeviceConfig, u16)> = rtl_kernels(config).collect();
    let model = if kernels.is_empty() {
        Model::N8
    } else {
        Model::N8Kernels
    };
    let mut plane = RtlPlane::new(RtlPlaneConfig {
        model,
        ring_depth: config.ring_depth,
        ..RtlPlaneConfig::default()
    });
    debug_assert_eq!(
        (
            rtl_kernel_port(KernelFunction::Echo),
            rtl_kernel_port(KernelFunction::Sum32),
            plane.port_count()
        ),
        (
            Some(Model::ECHO_PORT as u16),
            Some(Model::SUM32_PORT as u16),
            if kernels.is_empty() {
                8
            } else {
                RTL_KERNEL_MODEL_PORTS
            }
        )
    );
    for (d, port) in kernels {
        plane
            .reserve(port, &d.name)
            .map_err(|e| format!("device `{}`: {e}", d.name))?;
    }
    Ok(Arc::new(plane.spawn(run_mode(config))))
}

#[cfg(not(feature = "rtl"))]
fn open_rtl(_config: &Config) -> Result<Arc<dyn PlaneHandle>, String> {
    Err(NO_RTL.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use uniplane_overlay::{PlaneOp, PlaneReply, PortSpec};

    #[test]
    fn plane_names_parse_and_anything_else_is_refused_with_the_choices() {
        assert_eq!("engine".parse(), Ok(PlaneKind::Engine));
        assert_eq!("rtl".parse(), Ok(PlaneKind::Rtl));
        let e = "fpga".parse::<PlaneKind>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown plane `fpga`: expected \"engine\" or \"rtl\""
        );
        assert_eq!(PlaneKind::default(), PlaneKind::Engine);
    }

    fn attach_through(plane: &Arc<dyn PlaneHandle>) -> Vec<String> {
        let results = uniplane_overlay::remote::block_on(
            plane.submit(vec![PlaneOp::Attach(PortSpec::app("a"))]),
        )
        .unwrap();
        results
            .iter()
            .map(|r| match r {
                Ok(PlaneReply::Attached(p, _)) => format!("attached {p}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_engine_plane_opens_from_the_configuration() {
        let config = Config::embedded().unwrap();
        let plane = open_plane(PlaneKind::Engine, &config).unwrap();
        assert_eq!(plane.kind(), "engine");
        assert_eq!(attach_through(&plane), vec!["attached 0"]);
    }

    #[cfg(not(feature = "rtl"))]
    #[test]
    fn without_the_feature_the_rtl_plane_says_how_to_get_it() {
        let config = Config::embedded().unwrap();
        let Err(e) = open_plane(PlaneKind::Rtl, &config) else {
            panic!("an RTL plane without the feature");
        };
        assert_eq!(e, NO_RTL);
        assert!(e.contains("--features rtl") && !e.contains('\n'));
    }

    #[cfg(feature = "rtl")]
    #[test]
    fn with_the_feature_the_rtl_plane_opens_and_takes_batches() {
        let config = Config::embedded().unwrap();
        let plane = open_plane(PlaneKind::Rtl, &config).unwrap();
        assert_eq!(plane.kind(), "rtl");
        assert_eq!(attach_through(&plane), vec!["attached 0"]);
    }

    #[cfg(feature = "rtl")]
    fn rtl_kernels_config(devices: &str) -> Config {
        let text = format!("[server]\nid = \"127.0.0.1\"\n{devices}");
        Config::parse(&text, "c.toml").unwrap()
    }

    #[cfg(feature = "rtl")]
    fn device(name: &str, kind: &str, extra: &str) -> String {
        format!("\n[[devices]]\nname = \"{name}\"\nkind = \"{kind}\"\n{extra}")
    }

    #[cfg(feature = "rtl")]
    #[test]
    fn rtl_kernels_need_the_rtl_plane_one_device_per_kernel_and_a_port_for_an_application() {
        let echo = device("e", "kernel", "backend = \"rtl\"\nfunction = \"echo\"\n");
        let sum = device("s", "kernel", "backend = \"rtl\"\nfunction = \"sum32\"\n");
        let both = rtl_kernels_config(&format!("{echo}{sum}"));
        assert_eq!(
            rtl_kernels(&both)
                .map(|(d, p)| (d.name.as_str(), p))
                .collect::<Vec<_>>(),
            vec![("e", 6), ("s", 7)]
        );
        assert_eq!(check_kernels(&both, PlaneKind::Rtl), Ok(()));
        assert_eq!(
            check_kernels(&both, PlaneKind::Engine),
            Err(
                "device `e`: a `backend = \"rtl\"` kernel runs on the RTL plane, not on \
                 engine: start with --plane rtl (or plane = \"rtl\")"
                    .to_owned()
            )
        );
        let twice = rtl_kernels_config(&format!("{echo}{}", echo.replace("\"e\"", "\"f\"")));
        assert_eq!(
            check_kernels(&twice, PlaneKind::Rtl),
            Err("device `f`: the RTL has one echo kernel (port 6), already device `e`".to_owned())
        );
        // Six host ports: the daemon's, four other devices and an
        // application fit beside both kernels; a fifth device does not.
        let memories = |n: usize| -> String {
            (0..n)
                .map(|i| device(&format!("m{i}"), "memory", ""))
                .collect()
        };
        let full = rtl_kernels_config(&format!("{echo}{sum}{}", memories(4)));
        assert_eq!(check_kernels(&full, PlaneKind::Rtl), Ok(()));
        let crowded = rtl_kernels_config(&format!("{echo}{sum}{}", memories(5)));
        assert_eq!(
            check_kernels(&crowded, PlaneKind::Rtl),
            Err(
                "the RTL plane with kernels has 6 ports besides its kernels' (8 in all), \
                 and this daemon needs 7: its own, 5 for its other devices and one for an \
                 application (the rest are for further applications and tunnels)"
                    .to_owned()
            )
        );
        let Err(e) = open_plane(PlaneKind::Engine, &both) else {
            panic!("an rtl kernel on the engine");
        };
        assert!(e.contains("runs on the RTL plane"), "{e}");
    }

    #[cfg(feature = "rtl")]
    #[test]
    fn with_rtl_kernels_the_plane_keeps_their_ports_for_their_devices() {
        use uniplane_overlay::PortKind;
        let config = rtl_kernels_config(&device(
            "s",
            "kernel",
            "backend = \"rtl\"\nfunction = \"sum32\"\n",
        ));
        let plane = open_plane(PlaneKind::Rtl, &config).unwrap();
        let attach = |spec: PortSpec| match uniplane_overlay::remote::block_on(
            plane.submit(vec![PlaneOp::Attach(spec)]),
        )
        .unwrap()
        .pop()
        {
            Some(Ok(PlaneReply::Attached(p, _))) => Ok(p),
            Some(Err(e)) => Err(e.to_string()),
            other => Err(format!("{other:?}")),
        };
        let mut kernel = PortSpec::app("s");
        kernel.kind = PortKind::Device;
        // The kernel's port, whatever the order; ports 0 to 5 for the
        // rest; the echo kernel's port for nobody.
        assert_eq!(attach(PortSpec::app("a")), Ok(0));
        assert_eq!(attach(kernel), Ok(7));
        for p in 1..6 {
            assert_eq!(attach(PortSpec::app(&format!("b{p}"))), Ok(p));
        }
        assert!(attach(PortSpec::tunnel("t", 0, 1024)).is_err());
    }
}
