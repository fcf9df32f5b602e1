//! `uniplane-run`: N processes as one world through a daemon, and the
//! first failure ending the rest. Every wait has a deadline.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use tokio::process::Command;

const RUN: &str = env!("CARGO_BIN_EXE_uniplane-run");

/// The example program, which `cargo test` builds next to the tests.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(|deps| deps.parent()).unwrap();
    profile.join("examples").join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_allreduce_under_uniplane_run() {
    let (_daemon, dir) = common::daemon("launch").await;
    let program = example("allreduce");
    assert!(program.is_file(), "{} not built", program.display());
    let run = Command::new(RUN)
        .args(["-n", "4", "--runtime"])
        .arg(&dir)
        .arg(&program)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the job finishes in time")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for rank in 0..4 {
        assert!(
            stdout.contains(&format!("rank {rank} of 4: allreduce")),
            "{stdout}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_first_failing_rank_ends_the_others_and_gives_its_exit_code() {
    // Rank 1 fails at once; the others would sleep far past the deadline
    // unless the launcher ends them.
    let script = r#"if [ "$UNIPLANE_COLL_RANK" = 1 ]; then exit 3; fi; exec sleep 600"#;
    let run = Command::new(RUN)
        .args(["-n", "3", "sh", "-c", script])
        .kill_on_drop(true)
        .status();
    let status = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the launcher ends the sleeping ranks")
        .unwrap();
    assert_eq!(status.code(), Some(3));
}

#[tokio::test]
async fn ranks_see_their_rank_size_and_one_job_id() {
    let script = r#"echo "$UNIPLANE_COLL_RANK/$UNIPLANE_COLL_SIZE/$UNIPLANE_COLL_JOB""#;
    let run = Command::new(RUN)
        .args(["-n", "3", "--job", "j1", "sh", "-c", script])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("in time")
        .unwrap();
    assert!(out.status.success());
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    assert_eq!(lines, ["0/3/j1", "1/3/j1", "2/3/j1"]);
}
