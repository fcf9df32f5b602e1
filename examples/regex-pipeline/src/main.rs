//! `regex-pipeline`: the multi-regex application's command line.
//!
//! - `report`: how many of the rule set's `@rx` patterns each engine
//!   compiles, and why the rest do not (by rule ID).
//! - `devices`: the daemon configuration's `[[devices]]` for the chained
//!   and the relayed stages.
//! - `match`: matches files (or standard input) through a running
//!   daemon's stages — the chain's entry, or the relayed stages in turn —
//!   and beside them with PCRE2 on this core, and prints the rule IDs.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bytes::Bytes;
use clap::{Parser, Subcommand};
use uniplane_client::Client;
use uniplane_dataplane::Uid;
use uniplane_kernel::regex_stage::{engine, group_of};
use uniplane_regex_pipeline::one_core::OneCore;
use uniplane_regex_pipeline::pipeline::{self, Stages, STAGES};
use uniplane_regex_pipeline::report::{Engine, Report};
use uniplane_regex_pipeline::{EngineKind, PatternId, RuleSet, DEBIAN_CRS_RULES};

#[derive(Parser)]
#[command(version, about = "DUA's multi-regex matching application on uniplane")]
struct Cli {
    /// The directory of the ModSecurity rule files (`*.conf`).
    #[arg(long, global = true, default_value = DEBIAN_CRS_RULES)]
    rules: PathBuf,
    /// The stages' engine: automata or hyperscan.
    #[arg(long, global = true, default_value = "automata")]
    engine: String,
    /// The seed of the split into groups.
    #[arg(long, global = true, default_value_t = 1)]
    seed: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Counts the patterns each engine compiles and names the rest.
    Report,
    /// Prints the stage devices for a daemon's configuration.
    Devices {
        /// The daemon's server address.
        #[arg(long, default_value = "127.0.0.1")]
        server: Ipv4Addr,
        /// Device number of the first chained stage.
        #[arg(long, default_value_t = 11)]
        chained: u16,
        /// Device number of the first relayed stage.
        #[arg(long, default_value_t = 21)]
        relayed: u16,
    },
    /// Matches inputs through a running daemon's stages.
    Match {
        /// The daemon's runtime directory (default: the usual one).
        #[arg(long)]
        runtime: Option<PathBuf>,
        /// The chain's entry (`SERVER:DEVICE`); or `--relay`.
        #[arg(long, conflicts_with = "relay")]
        entry: Option<Uid>,
        /// The stages to relay through, in order (`SERVER:DEVICE,…`).
        #[arg(long, value_delimiter = ',')]
        relay: Vec<Uid>,
        /// Files to match, one input each (none: standard input).
        files: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("regex-pipeline: {e}");
            ExitCode::FAILURE
        }
    }
}

fn load(rules: &Path) -> Result<RuleSet, String> {
    RuleSet::load(rules).map_err(|e| format!("the rules: {e}"))
}

fn run(cli: &Cli) -> Result<ExitCode, String> {
    let kind = EngineKind::parse(&cli.engine)?;
    match &cli.command {
        Command::Report => {
            let set = load(&cli.rules)?;
            let mut engines = vec![Engine::Stage(EngineKind::Automata)];
            if EngineKind::parse("hyperscan").is_ok() {
                engines.push(Engine::Stage(EngineKind::Hyperscan));
            }
            engines.push(Engine::Pcre2);
            print!("{}", Report::new(&set, &engines));
            Ok(ExitCode::SUCCESS)
        }
        Command::Devices {
            server,
            chained,
            relayed,
        } => {
            let stages = Stages {
                rules: cli.rules.display().to_string(),
                engine: kind,
                seed: cli.seed,
                max_input: 16_384,
                chained: *chained,
                relayed: *relayed,
                stall_timeout_ms: 1000,
            };
            print!("{}", stages.devices(*server));
            Ok(ExitCode::SUCCESS)
        }
        Command::Match {
            runtime,
            entry,
            relay,
            files,
        } => {
            if entry.is_none() && relay.len() != usize::from(STAGES) {
                return Err(format!("--entry, or --relay with {STAGES} stages"));
            }
            let set = load(&cli.rules)?;
            // The baseline matches what the stages match: every group's
            // patterns that the stages' engine compiles.
            let stage_patterns: Vec<PatternId> = (0..u32::from(STAGES))
                .flat_map(|g| group_of(&set, u32::from(STAGES), g, cli.seed))
                .filter(|p| engine::check(kind, &p.regex).is_ok())
                .map(|p| p.id)
                .collect();
            let one = OneCore::new(&set, |id| stage_patterns.contains(&id));
            let inputs = read_inputs(files)?;
            let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
            let answers = rt.block_on(async {
                let client = match runtime {
                    Some(dir) => Client::connect(dir).await,
                    None => Client::connect_default().await,
                }
                .map_err(|e| e.to_string())?;
                let session = client
                    .attach("regex-pipeline")
                    .await
                    .map_err(|e| e.to_string())?;
                match entry {
                    Some(uid) => pipeline::through_uniplane(&session, *uid, &inputs, 8).await,
                    None => pipeline::through_cpu(&session, relay, &inputs).await,
                }
                .map_err(|e| e.to_string())
            })?;
            let mut code = ExitCode::SUCCESS;
            let mut found = Vec::new();
            for ((name, input), answer) in files_or_stdin(files).iter().zip(&inputs).zip(answers) {
                let ids = |l: &[PatternId]| {
                    l.iter()
                        .map(|i| i.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                let baseline = one.matches(input, &mut found).map(|()| found.clone());
                match (answer.list, baseline) {
                    (Ok(list), Ok(base)) => {
                        println!("{name}: {} ({:?})", ids(&list), answer.latency);
                        if list != base {
                            println!("  PCRE2 on this core differs: {}", ids(&base));
                            code = ExitCode::FAILURE;
                        }
                    }
                    (Err(e), _) => {
                        println!("{name}: {e}");
                        code = ExitCode::FAILURE;
                    }
                    (_, Err(e)) => {
                        println!("{name}: PCRE2: {e}");
                        code = ExitCode::FAILURE;
                    }
                }
            }
            Ok(code)
        }
    }
}

fn files_or_stdin(files: &[PathBuf]) -> Vec<String> {
    if files.is_empty() {
        vec!["-".into()]
    } else {
        files.iter().map(|f| f.display().to_string()).collect()
    }
}

fn read_inputs(files: &[PathBuf]) -> Result<Vec<Bytes>, String> {
    if files.is_empty() {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
            .map_err(|e| format!("standard input: {e}"))?;
        return Ok(vec![Bytes::from(buf)]);
    }
    files
        .iter()
        .map(|f| {
            std::fs::read(f)
                .map(Bytes::from)
                .map_err(|e| format!("{}: {e}", f.display()))
        })
        .collect()
}
