//! Joining the world: who this process is, finding the other ranks
//! through the daemon, and connecting to them.
//!
//! Rendezvous goes through the daemon and nothing else: rank `r` of job
//! `J` attaches as a resource named `coll-J-r` and listens on
//! [`Options::port`]. When the daemon has a naming service
//! (`[registry] kind = "etcd"`), the rank then claims that name in the
//! cluster's directory, and every rank resolves the others' names there —
//! so ranks on any servers meet. Without one, every rank asks its daemon
//! (and those of [`Options::also_ask`]) for its resources (the control
//! request `resources`, which lists each attached session with its name,
//! UID and listening ports) until all `size` names are there, listening. Rank `i` connects to every rank `j > i` and accepts
//! from every rank `j < i`; the acceptor greets each connection with a
//! WELCOME frame, once, and the connector sends nothing before it
//! arrives.
//!
//! The job id, rank and size come from the environment (see
//! [`WorldSpec::from_env`]), so programs run under `uniplane-run`,
//! OpenMPI's `mpirun`, MPICH's Hydra or Slurm's `srun` alike.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::future::try_join_all;
use tokio::time::Instant;
use uniplane_client::protocol::Request;
use uniplane_client::{Client, ClientError, Connection, DataPathOptions, Session, Wait};
use uniplane_dataplane::Uid;

use crate::comm::{mix, Communicator, Fabric};
use crate::frame::{self, Frame, Key, Kind};
use crate::transport::{Limits, Peer, Stats};
use crate::tuning::Tuning;
use crate::Error;

/// The launcher's environment variables (`uniplane-run` sets them).
pub mod env {
    /// This process's world rank.
    pub const RANK: &str = "UNIPLANE_COLL_RANK";
    /// The world size.
    pub const SIZE: &str = "UNIPLANE_COLL_SIZE";
    /// The job id: ranks of one job find each other by it.
    pub const JOB: &str = "UNIPLANE_COLL_JOB";
}

/// Who this process is in which world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorldSpec {
    /// The job: processes of one job share it, and only they meet.
    pub job: String,
    /// This process's rank, `0..size`.
    pub rank: usize,
    /// Number of processes.
    pub size: usize,
}

impl WorldSpec {
    /// From the environment, the first launcher found:
    /// `uniplane-run` (`UNIPLANE_COLL_RANK`, `_SIZE`, `_JOB`), OpenMPI
    /// (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, job from
    /// `OMPI_MCA_ess_base_jobid`), MPICH's Hydra (`PMI_RANK`, `PMI_SIZE`,
    /// job from `PMI_KVSNAME`), Slurm (`SLURM_PROCID`, `SLURM_NTASKS`,
    /// job from `SLURM_JOB_ID` and `SLURM_STEP_ID`). `UNIPLANE_COLL_JOB`
    /// overrides the job id of any launcher; without one, the job is
    /// `default`.
    pub fn from_env() -> Result<WorldSpec, Error> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// [`WorldSpec::from_env`] over any lookup (for tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<WorldSpec, Error> {
        let launchers: [(&str, &str, &[&str]); 4] = [
            (env::RANK, env::SIZE, &[]),
            (
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                &["OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid"],
            ),
            ("PMI_RANK", "PMI_SIZE", &["PMI_KVSNAME"]),
            (
                "SLURM_PROCID",
                "SLURM_NTASKS",
                &["SLURM_JOB_ID", "SLURM_STEP_ID"],
            ),
        ];
        for (rank_var, size_var, job_vars) in launchers {
            let (Some(rank), Some(size)) = (get(rank_var), get(size_var)) else {
                continue;
            };
            let parse = |var: &str, v: &str| {
                v.trim()
                    .parse::<usize>()
                    .map_err(|_| Error::Setup(format!("{var}={v:?} is not a number")))
            };
            let (rank, size) = (parse(rank_var, &rank)?, parse(size_var, &size)?);
            if size == 0 || rank >= size {
                return Err(Error::Setup(format!(
                    "rank {rank} of a world of {size} ({rank_var}, {size_var})"
                )));
            }
            let launcher_job: Vec<String> = job_vars.iter().filter_map(|v| get(v)).collect();
            let job = get(env::JOB)
                .or_else(|| (!launcher_job.is_empty()).then(|| launcher_job.join(".")))
                .unwrap_or_else(|| "default".into());
            if job.is_empty() || job.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(Error::Setup(format!("job id {job:?}")));
            }
            return Ok(WorldSpec { job, rank, size });
        }
        Err(Error::Setup(
            "no launcher environment (UNIPLANE_COLL_RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID)".into(),
        ))
    }

    /// The resource name of `rank` of this job.
    pub fn name_of(&self, rank: usize) -> String {
        format!("coll-{}-{rank}", self.job)
    }
}

/// Settings of a world.
#[derive(Clone, Debug)]
pub struct Options {
    /// The port every rank listens on.
    pub port: u16,
    /// How long any one wait of an operation may take before it fails
    /// with [`Error::Timeout`].
    pub timeout: Duration,
    /// How long joining may take (all ranks must have started by then).
    pub setup_timeout: Duration,
    /// Receive window per peer in bytes: what a peer may have buffered
    /// here before it waits for credit (kept between 4 KiB and 1 GiB).
    pub window: u64,
    /// Eager threshold in bytes (see
    /// [`Communicator::set_eager_threshold`]); at most half the window
    /// minus 64 takes effect. The default, 256 KiB, makes every message
    /// that fits the default window's half eager: over shared memory on
    /// one daemon, eager beat rendezvous at every size measured
    /// (docs/collectives.md).
    pub eager_threshold: usize,
    /// How the session's data path waits (busy-polling or parking).
    pub wait: Wait,
    /// The algorithm table.
    pub tuning: Tuning,
    /// Runtime directories of further daemons on this host whose
    /// resources are searched for ranks too: ranks attached to different
    /// daemons (peered, so their UIDs route to each other) meet this way.
    /// Empty: only this rank's own daemon.
    pub also_ask: Vec<PathBuf>,
    /// The name of a reduction operator endpoint
    /// ([`crate::ReductionOperator`]) that every `allreduce` and `reduce`
    /// goes through from the start (see
    /// [`Communicator::use_reduction_operator`]); joining waits up to
    /// `timeout` for it to appear. `None`: the ranks' own algorithms.
    pub reduction_operator: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            port: 7170,
            timeout: Duration::from_secs(30),
            setup_timeout: Duration::from_secs(30),
            window: 512 * 1024,
            eager_threshold: 256 * 1024,
            wait: Wait::default(),
            tuning: Tuning::default(),
            also_ask: Vec::new(),
            reduction_operator: None,
        }
    }
}

/// Joins the world the environment describes ([`WorldSpec::from_env`])
/// through the daemon of the default runtime directory
/// (`$UNIPLANE_RUNTIME_DIR`, …), with default [`Options`].
pub async fn init() -> Result<Communicator, Error> {
    let spec = WorldSpec::from_env()?;
    let client = Client::connect_default().await?;
    join(client, &spec, Options::default()).await
}

/// Joins the world `spec` through `client`'s daemon: attaches this
/// process as rank `spec.rank`, finds the other ranks and connects to
/// them. Returns the world communicator once every rank is connected.
pub async fn join(
    client: Client,
    spec: &WorldSpec,
    options: Options,
) -> Result<Communicator, Error> {
    let deadline = Instant::now() + options.setup_timeout;
    let session = client
        .attach_with(
            &spec.name_of(spec.rank),
            DataPathOptions { wait: options.wait },
        )
        .await?;
    let mut listener = session.listen(options.port).await?;
    // Claimed once listening, so a rank that resolves the name can
    // connect at once.
    let directory = match session.register(&spec.name_of(spec.rank)).await {
        Ok(()) => true,
        Err(ClientError::Daemon { kind, .. }) if kind == "unsupported" => false,
        Err(ClientError::Daemon { kind, message }) if kind == "exists" => {
            return Err(Error::Setup(format!(
                "{message}: is another job using the id {:?}?",
                spec.job
            )))
        }
        Err(e) => return Err(e.into()),
    };
    let mut others = Vec::new();
    for dir in &options.also_ask {
        others.push(Client::connect(dir).await?);
    }
    let uids = discover(&session, &others, spec, options.port, directory, deadline).await?;
    let rank_of: HashMap<Uid, usize> = uids.iter().enumerate().map(|(i, u)| (*u, i)).collect();
    let me = spec.rank;

    let accept = async {
        let mut got = Vec::new();
        while got.len() < me {
            let conn = tokio::time::timeout_at(deadline, listener.accept())
                .await
                .map_err(|_| {
                    Error::Setup(format!("rank {me}: lower ranks did not connect in time"))
                })?
                .ok_or_else(|| Error::Setup("the session ended".into()))?;
            let Some(&who) = rank_of.get(&conn.remote().uid).filter(|&&w| w < me) else {
                tracing::warn!(remote = %conn.remote(), "refused a connection from outside the job");
                continue;
            };
            let mut conn = conn;
            let welcome = frame::control(Kind::Welcome, Key { comm: 0, tag: 0 }, me as u64);
            conn.send_bytes(welcome)
                .await
                .map_err(|e| Error::Setup(format!("greeting rank {who}: {e}")))?;
            got.push((who, conn));
        }
        Ok::<_, Error>(got)
    };
    let connect = try_join_all((me + 1..spec.size).map(|j| {
        let session = &session;
        let target = uids[j].port(options.port);
        async move {
            let mut conn = session.connect(target).await?;
            // The acceptor speaks first (WELCOME), once: data sent before
            // it has accepted could be lost. Its WELCOME cannot be: our
            // daemon admits the connection before the acceptor's hears of
            // it, across a tunnel too.
            match tokio::time::timeout_at(deadline, conn.recv()).await {
                Err(_) => Err(Error::Setup(format!("rank {j} did not greet in time"))),
                Ok(None) => Err(Error::Setup(format!("rank {j} closed before greeting"))),
                Ok(Some(Err(e))) => Err(Error::Setup(format!("rank {j}: {e}"))),
                Ok(Some(Ok(m))) => match Frame::parse(m.payload()) {
                    Ok(f) if f.kind == Kind::Welcome && f.value == j as u64 => {
                        Ok::<_, Error>((j, conn))
                    }
                    other => Err(Error::Setup(format!("rank {j} greeted with {other:?}"))),
                },
            }
        }
    }));
    let (accepted, connected) = futures_util::future::try_join(accept, connect).await?;
    drop(listener);

    let limits = Limits {
        window: options.window.clamp(4 * 1024, 1 << 30),
        timeout: options.timeout,
    };
    let stats = Arc::new(Stats::default());
    let mut conns: HashMap<usize, Connection> = accepted.into_iter().chain(connected).collect();
    let peers = (0..spec.size)
        .map(|i| match conns.remove(&i) {
            Some(conn) => Peer::over(i, conn, limits, stats.clone()),
            None => Peer::own(i),
        })
        .collect();
    let fabric = Arc::new(Fabric {
        session: Arc::new(session),
        rank: me,
        peers,
        limits,
        eager_threshold: AtomicUsize::new(options.eager_threshold),
        tuning: RwLock::new(options.tuning),
        stats,
        operator: RwLock::new(None),
        relay: RwLock::new(None),
    });
    let id = spec
        .job
        .bytes()
        .fold(0x636f_6c6c_u64, |h, b| mix(h, u64::from(b)));
    let comm = Communicator::new(fabric, id, (0..spec.size).collect());
    if let Some(name) = &options.reduction_operator {
        comm.use_reduction_operator(Some(name)).await?;
    }
    Ok(comm)
}

/// The UID of every rank of `spec`, once all of them listen on `port`:
/// from the cluster's directory (`directory`: ranks claim their names
/// there once listening) or the daemons' resource lists.
async fn discover(
    session: &Session,
    others: &[Client],
    spec: &WorldSpec,
    port: u16,
    directory: bool,
    deadline: Instant,
) -> Result<Vec<Uid>, Error> {
    let names: HashMap<String, usize> = (0..spec.size).map(|i| (spec.name_of(i), i)).collect();
    let mut pause = Duration::from_millis(1);
    if directory {
        let wanted: Vec<String> = (0..spec.size).map(|i| spec.name_of(i)).collect();
        let uids = session.client().resolve_all(&wanted, deadline).await?;
        let missing: Vec<usize> = (0..spec.size).filter(|&i| uids[i].is_none()).collect();
        if !missing.is_empty() {
            return Err(Error::Setup(format!(
                "ranks {missing:?} of job {:?} did not appear in the directory in time",
                spec.job
            )));
        }
        return Ok(uids.into_iter().flatten().collect());
    }
    loop {
        let mut lists = vec![session.client().request(&Request::Resources).await?];
        for c in others {
            lists.push(c.request(&Request::Resources).await?);
        }
        let mut uids: Vec<Option<Uid>> = vec![None; spec.size];
        for r in lists.iter().filter_map(|l| l.as_array()).flatten() {
            let Some(&rank) = r
                .get("name")
                .and_then(|n| n.as_str())
                .and_then(|n| names.get(n))
            else {
                continue;
            };
            let listening = r
                .get("listening")
                .and_then(|l| l.as_array())
                .is_some_and(|l| l.iter().any(|p| p.as_u64() == Some(u64::from(port))));
            let uid = r
                .get("uid")
                .and_then(|u| u.as_str())
                .and_then(|u| u.parse().ok());
            if let (true, Some(uid)) = (listening, uid) {
                if uids[rank].replace(uid).is_some() {
                    return Err(Error::Setup(format!(
                        "two resources are named {}: is another job using the id {:?}?",
                        spec.name_of(rank),
                        spec.job
                    )));
                }
            }
        }
        if uids.iter().all(Option::is_some) {
            return Ok(uids.into_iter().flatten().collect());
        }
        if Instant::now() + pause > deadline {
            let missing: Vec<usize> = (0..spec.size).filter(|&i| uids[i].is_none()).collect();
            return Err(Error::Setup(format!(
                "ranks {missing:?} of job {:?} did not appear in time",
                spec.job
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn every_launcher_environment_gives_rank_size_and_job() {
        let ours = [(env::RANK, "1"), (env::SIZE, "4"), (env::JOB, "j7")];
        assert_eq!(
            WorldSpec::from_lookup(lookup(&ours)).unwrap(),
            WorldSpec {
                job: "j7".into(),
                rank: 1,
                size: 4
            }
        );
        let ompi = [
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("OMPI_MCA_ess_base_jobid", "1234"),
        ];
        assert_eq!(
            WorldSpec::from_lookup(lookup(&ompi)).unwrap(),
            WorldSpec {
                job: "1234".into(),
                rank: 2,
                size: 3
            }
        );
        let hydra = [
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "2"),
            ("PMI_KVSNAME", "kvs_9_0"),
        ];
        assert_eq!(
            WorldSpec::from_lookup(lookup(&hydra)).unwrap().job,
            "kvs_9_0"
        );
        let slurm = [
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_JOB_ID", "77"),
            ("SLURM_STEP_ID", "0"),
        ];
        let s = WorldSpec::from_lookup(lookup(&slurm)).unwrap();
        assert_eq!((s.rank, s.size, s.job.as_str()), (3, 8, "77.0"));
    }

    #[test]
    fn a_bad_environment_is_an_error() {
        assert!(WorldSpec::from_lookup(lookup(&[])).is_err());
        assert!(WorldSpec::from_lookup(lookup(&[(env::RANK, "4"), (env::SIZE, "4")])).is_err());
        assert!(WorldSpec::from_lookup(lookup(&[(env::RANK, "x"), (env::SIZE, "4")])).is_err());
    }
}
