//! Which forwarding plane the daemon runs on, and opening it: the software
//! engine, or the simulated RTL under `hw/` (cargo feature `rtl`). Either
//! way the daemon gets one `Arc<dyn PlaneHandle>` and programs it with the
//! same batched `PlaneOp`s.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use uniplane_overlay::{spawn_sharded, Engine, EngineConfig, PlaneHandle, RunMode, ShardConfig};

use crate::config::{Config, EngineMode};

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
///   32-beat queues, 32 forwarding entries per port). Without the `rtl`
///   feature this is the error [`NO_RTL`].
pub fn open_plane(kind: PlaneKind, config: &Config) -> Result<Arc<dyn PlaneHandle>, String> {
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
    let plane = RtlPlane::new(RtlPlaneConfig {
        model: Model::N8,
        ring_depth: config.ring_depth,
        ..RtlPlaneConfig::default()
    });
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
}
