//! The stages as kernel devices of a daemon, and the two ways an
//! application drives them.
//!
//! ```text
//!  chained (next):  device c0 ══▶ c1 ══▶ c2     app: send to c0, its answer is c2's
//!  relayed:         device r0     r1     r2     app: send to r0, answer → r1, answer → r2
//! ```
//!
//! Both sets are the same three `regex-stage` kernels (same rules, seed,
//! engine, groups); the chained set names `next`, the relayed one does
//! not. An application reaches each by its UID: the code below does not
//! know where a stage runs or which path joins two stages.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use uniplane_client::{ClientError, Connection, Session};
use uniplane_dataplane::{LinkError, Uid};
use uniplane_kernel::regex_stage::{decode_match_list, engine::EngineKind};
use uniplane_kernel::KernelError;

use crate::PatternId;

/// The kernel port the stages answer on.
pub const PORT: u16 = 7;

/// How the stages are configured.
#[derive(Clone, Debug)]
pub struct Stages {
    /// The rule files' directory.
    pub rules: String,
    /// Their engine.
    pub engine: EngineKind,
    /// The split's seed.
    pub seed: u64,
    /// The largest input a stage takes.
    pub max_input: usize,
    /// Device number of the first chained stage (the others follow it).
    pub chained: u16,
    /// Device number of the first relayed stage (the others follow it).
    pub relayed: u16,
    /// How long a stage may leave requests unanswered before the daemon
    /// declares it failed.
    pub stall_timeout_ms: u64,
}

/// How many stages.
pub const STAGES: u16 = 3;

impl Stages {
    /// The `[[devices]]` of both sets for the daemon of server `server`.
    ///
    /// Messages of up to 256 B take the PIO mailbox, larger ones FPGA
    /// Connect (the kernel devices' default).
    pub fn devices(&self, server: Ipv4Addr) -> String {
        let mut text = String::new();
        for (set, first, chained) in [
            ("chained", self.chained, true),
            ("relayed", self.relayed, false),
        ] {
            for g in 0..STAGES {
                let device = first + g;
                let next = if chained && g + 1 < STAGES {
                    format!("next = \"{server}:{}\"\n", device + 1)
                } else {
                    String::new()
                };
                text.push_str(&format!(
                    "\n[[devices]]\nname = \"{set}{g}\"\nkind = \"kernel\"\ndevice = {device}\n\
                     backend = \"emulated\"\nfunction = \"regex-stage\"\n{next}\
                     stall_timeout_ms = {}\n\
                     params = {{ rules = \"{}\", groups = {STAGES}, group = {g}, seed = {}, \
                     engine = \"{}\", max_input = {} }}\n",
                    self.stall_timeout_ms,
                    self.rules.replace('\\', "\\\\").replace('"', "\\\""),
                    self.seed,
                    self.engine.name(),
                    self.max_input,
                ));
            }
        }
        text
    }

    /// The UID of stage `g` of the chained set on `server`.
    pub fn chained_uid(&self, server: Ipv4Addr, g: u16) -> Uid {
        Uid::new(server, self.chained + g)
    }

    /// The UID of stage `g` of the relayed set on `server`.
    pub fn relayed_uid(&self, server: Ipv4Addr, g: u16) -> Uid {
        Uid::new(server, self.relayed + g)
    }
}

/// Why an input got no match list.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The data path failed (the connection, the daemon).
    #[error("the data path: {0}")]
    Link(#[from] LinkError),
    /// A control request failed (connecting).
    #[error("the daemon: {0}")]
    Client(#[from] ClientError),
    /// A stage answered an error (an input too large, a stage down).
    #[error("stage {stage} answered an error: {status}")]
    Refused {
        /// Which stage (0 for the chain's entry: its error may be any
        /// stage's).
        stage: usize,
        /// The status.
        status: String,
    },
    /// The answer is not a match list.
    #[error("the answer is not a match list: {0}")]
    Answer(KernelError),
    /// The connection closed with inputs unanswered.
    #[error("the connection closed with the input unanswered")]
    Closed,
    /// No answer within the deadline.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// One input's outcome.
#[derive(Debug)]
pub struct Answer {
    /// The IDs found, ascending, or why not.
    pub list: Result<Vec<PatternId>, PipelineError>,
    /// From sending it to its match list.
    pub latency: Duration,
}

/// How long one answer may take before the input counts as lost.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(10);

async fn recv(conn: &mut Connection, stage: usize) -> Result<Bytes, PipelineError> {
    match tokio::time::timeout(ANSWER_DEADLINE, conn.recv()).await {
        Err(_) => Err(PipelineError::Timeout(ANSWER_DEADLINE)),
        Ok(None) => Err(PipelineError::Closed),
        Ok(Some(Err(LinkError::PeerFailed(status)))) => {
            Err(PipelineError::Refused { stage, status })
        }
        Ok(Some(Err(e))) => Err(e.into()),
        Ok(Some(Ok(m))) => Ok(m.payload().clone()),
    }
}

fn list(bytes: &[u8]) -> Result<Vec<PatternId>, PipelineError> {
    decode_match_list(bytes).map_err(PipelineError::Answer)
}

/// Through uniplane: every input is sent to the chain's entry `entry`,
/// up to `depth` in flight, each answer being the last stage's.
pub async fn through_uniplane(
    session: &Session,
    entry: Uid,
    inputs: &[Bytes],
    depth: usize,
) -> Result<Vec<Answer>, PipelineError> {
    let mut conn = session.connect(entry.port(PORT)).await?;
    let mut answers = Vec::with_capacity(inputs.len());
    let mut sent: VecDeque<Instant> = VecDeque::with_capacity(depth);
    let mut next = 0;
    while answers.len() < inputs.len() {
        while next < inputs.len() && sent.len() < depth.max(1) {
            conn.send_bytes(inputs[next].clone()).await?;
            sent.push_back(Instant::now());
            next += 1;
        }
        let answer = recv(&mut conn, 0).await;
        let t0 = sent.pop_front().unwrap_or_else(Instant::now);
        let latency = t0.elapsed();
        match answer {
            // The connection is gone: every input in flight and unsent
            // is answered with the error, none waits.
            Err(
                e @ (PipelineError::Closed | PipelineError::Timeout(_) | PipelineError::Link(_)),
            ) => {
                let text = e.to_string();
                answers.push(Answer {
                    list: Err(e),
                    latency,
                });
                while answers.len() < inputs.len() {
                    answers.push(Answer {
                        list: Err(PipelineError::Refused {
                            stage: 0,
                            status: text.clone(),
                        }),
                        latency,
                    });
                }
            }
            answer => answers.push(Answer {
                list: answer.and_then(|b| list(&b)),
                latency,
            }),
        }
    }
    Ok(answers)
}

/// Through the CPU: the relay sends each input to stage 0, waits for its
/// answer, sends that to stage 1, and so on; one input at a time.
pub async fn through_cpu(
    session: &Session,
    stages: &[Uid],
    inputs: &[Bytes],
) -> Result<Vec<Answer>, PipelineError> {
    let mut conns = Vec::with_capacity(stages.len());
    for uid in stages {
        conns.push(session.connect(uid.port(PORT)).await?);
    }
    let mut answers = Vec::with_capacity(inputs.len());
    for input in inputs {
        let t0 = Instant::now();
        let mut message = input.clone();
        let mut outcome = Ok(());
        for (stage, conn) in conns.iter_mut().enumerate() {
            if let Err(e) = conn.send_bytes(message.clone()).await {
                outcome = Err(e.into());
                break;
            }
            match recv(conn, stage).await {
                Ok(answer) => message = answer,
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        answers.push(Answer {
            list: outcome.and_then(|()| list(&message)),
            latency: t0.elapsed(),
        });
    }
    Ok(answers)
}
