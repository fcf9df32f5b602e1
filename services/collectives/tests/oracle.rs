//! Every collective × datatype × operation against OpenMPI: the C oracle
//! (`oracle/oracle.c`, built here with `mpicc.openmpi`) and this crate
//! run the same cases on the same inputs, with 2, 3 and 4 ranks; integer
//! results must match bit for bit, float results (integer-valued inputs,
//! so exact in any order) within a relative 1e-6. One `mpirun` per rank
//! count runs every case.
//!
//! Without OpenMPI the test prints why and passes, unless
//! `UNIPLANE_REQUIRE_TOOLS=1`, when it fails.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{on_all, options, world};
use uniplane_collectives::{Algorithm, Collective, Communicator, Datatype, Element, Error, Op};

const COUNT: usize = 7;
const BLOCK: usize = 3;
const A2A: usize = 2;
const SEED: u64 = 20_240_917;

/// Must match `value` in oracle.c.
fn value(seed: u64, rank: usize, i: usize) -> u64 {
    let mut x = (rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= (i as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= seed.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 32)
}

trait FromSeed: Element {
    fn from_seed(x: u64) -> Self;
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl FromSeed for $t {
            fn from_seed(x: u64) -> Self {
                x as $t
            }
        }
    )*};
}
from_int!(i8, i16, i32, i64, u8, u16, u32, u64);

impl FromSeed for f32 {
    fn from_seed(x: u64) -> Self {
        ((x % 17) as i32 - 8) as f32
    }
}

impl FromSeed for f64 {
    fn from_seed(x: u64) -> Self {
        ((x % 17) as i32 - 8) as f64
    }
}

fn fill<T: FromSeed>(rank: usize, n: usize) -> Vec<T> {
    (0..n).map(|i| T::from_seed(value(SEED, rank, i))).collect()
}

fn line<T: Element>(coll: &str, op: &str, rank: usize, data: &[T]) -> String {
    let mut bytes = Vec::new();
    T::encode(data, &mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{coll} {} {op} {rank} {hex}", T::DATATYPE.name())
}

/// The oracle's cases for one datatype, in its order, on this rank.
async fn cases<T: FromSeed>(comm: &Communicator, out: &mut Vec<String>) -> Result<(), Error> {
    let (r, n) = (comm.rank(), comm.size());
    let root = n - 1;
    let mut buf: Vec<T> = if r == root {
        fill(root, COUNT)
    } else {
        vec![T::default(); COUNT]
    };
    comm.bcast(&mut buf, root).await?;
    out.push(line("bcast", "-", r, &buf));
    for op in Op::ALL {
        let mine: Vec<T> = fill(r, COUNT);
        if let Some(res) = comm.reduce(&mine, op, root).await? {
            out.push(line("reduce", op.name(), r, &res));
        }
        let res = comm.allreduce(&mine, op).await?;
        out.push(line("allreduce", op.name(), r, &res));
        let res = comm.reduce_scatter(&fill::<T>(r, BLOCK * n), op).await?;
        out.push(line("reduce_scatter", op.name(), r, &res));
    }
    let mine: Vec<T> = fill(r, BLOCK);
    out.push(line("allgather", "-", r, &comm.allgather(&mine).await?));
    if let Some(res) = comm.gather(&mine, root).await? {
        out.push(line("gather", "-", r, &res));
    }
    let all: Vec<T> = fill(r, BLOCK * n);
    let res = comm
        .scatter(if r == root { &all[..] } else { &[] }, BLOCK, root)
        .await?;
    out.push(line("scatter", "-", r, &res));
    let res = comm.alltoall(&fill::<T>(r, A2A * n)).await?;
    out.push(line("alltoall", "-", r, &res));
    Ok(())
}

async fn all_cases(comm: Communicator) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    for dt in Datatype::ALL {
        match dt {
            Datatype::I8 => cases::<i8>(&comm, &mut out).await?,
            Datatype::I16 => cases::<i16>(&comm, &mut out).await?,
            Datatype::I32 => cases::<i32>(&comm, &mut out).await?,
            Datatype::I64 => cases::<i64>(&comm, &mut out).await?,
            Datatype::U8 => cases::<u8>(&comm, &mut out).await?,
            Datatype::U16 => cases::<u16>(&comm, &mut out).await?,
            Datatype::U32 => cases::<u32>(&comm, &mut out).await?,
            Datatype::U64 => cases::<u64>(&comm, &mut out).await?,
            Datatype::F32 => cases::<f32>(&comm, &mut out).await?,
            Datatype::F64 => cases::<f64>(&comm, &mut out).await?,
        }
    }
    Ok(out)
}

fn find(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

/// `case key → hex` from lines `coll dtype op rank hex`.
fn by_case(lines: &[String]) -> BTreeMap<String, String> {
    lines
        .iter()
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn floats(hex: &str, size: usize) -> Vec<f64> {
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect();
    bytes
        .chunks_exact(size)
        .map(|c| match size {
            4 => f32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as f64,
            _ => f64::from_le_bytes(c.try_into().unwrap_or([0; 8])),
        })
        .collect()
}

fn compare(
    n: usize,
    label: &str,
    reference: &BTreeMap<String, String>,
    ours: &BTreeMap<String, String>,
) {
    let missing: Vec<_> = reference
        .keys()
        .filter(|k| !ours.contains_key(*k))
        .collect();
    let extra: Vec<_> = ours
        .keys()
        .filter(|k| !reference.contains_key(*k))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{n} ranks ({label}): missing {missing:?}, extra {extra:?}"
    );
    let mut wrong = Vec::new();
    for (case, want) in reference {
        let got = &ours[case];
        if got == want {
            continue;
        }
        let dtype = case.split(' ').nth(1).unwrap_or("");
        let size = match dtype {
            "f32" => 4,
            "f64" => 8,
            _ => 0,
        };
        let close = size > 0 && {
            let (a, b) = (floats(got, size), floats(want, size));
            a.len() == b.len()
                && a.iter()
                    .zip(&b)
                    .all(|(x, y)| (x - y).abs() <= 1e-6 * y.abs().max(1.0))
        };
        if !close {
            wrong.push(format!("{case}: ours {got}, OpenMPI {want}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{n} ranks ({label}): {} cases differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_collective_datatype_and_op_matches_openmpi() {
    let (Some(mpicc), Some(mpirun)) = (find("mpicc.openmpi"), find("mpirun.openmpi")) else {
        uniplane_netns::require_tool(
            "every_collective_datatype_and_op_matches_openmpi",
            Some("OpenMPI: mpicc.openmpi and mpirun.openmpi (openmpi-bin, libopenmpi-dev)"),
        );
        return;
    };
    let dir = std::env::temp_dir().join(format!("uniplane-coll-oracle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("oracle");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("oracle/oracle.c");
    let built = std::process::Command::new(&mpicc)
        .arg("-O2")
        .arg("-o")
        .arg(&exe)
        .arg(&source)
        .status()
        .expect("run mpicc");
    assert!(built.success(), "mpicc failed on {}", source.display());

    for n in [2usize, 3, 4] {
        let out = dir.join(format!("n{n}"));
        std::fs::create_dir_all(&out).unwrap();
        let run = tokio::process::Command::new(&mpirun)
            .args([
                "--oversubscribe",
                "--mca",
                "op",
                "^avx",
                "-n",
                &n.to_string(),
            ])
            .arg(&exe)
            .arg(&out)
            .arg(SEED.to_string())
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .kill_on_drop(true)
            .status();
        let status = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("mpirun finishes in time")
            .expect("run mpirun");
        assert!(status.success(), "mpirun -n {n} failed: {status}");
        let mut reference = Vec::new();
        for r in 0..n {
            let text = std::fs::read_to_string(out.join(format!("rank{r}.txt"))).unwrap();
            reference.extend(text.lines().map(str::to_string));
        }
        let reference = by_case(&reference);

        let w = world(&format!("oracle{n}"), n, options()).await;
        // The default table, then every collective on its other algorithm.
        for label in ["default algorithms", "alternative algorithms"] {
            if label.starts_with("alternative") {
                for comm in &w.comms {
                    let mut t = comm.tuning();
                    for c in [
                        Collective::Bcast,
                        Collective::Reduce,
                        Collective::Allreduce,
                        Collective::Allgather,
                        Collective::ReduceScatter,
                    ] {
                        let algs = Algorithm::supported(c);
                        t.force(c, algs[algs.len() - 1]);
                    }
                    comm.set_tuning(t);
                }
            }
            let ours: Vec<String> = on_all(&w.comms, all_cases)
                .await
                .into_iter()
                .enumerate()
                .flat_map(|(r, l)| l.unwrap_or_else(|e| panic!("{n} ranks, rank {r}: {e}")))
                .collect();
            compare(n, label, &reference, &by_case(&ours));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
