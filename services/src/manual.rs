//! Manual pages and shell completions generated from a binary's clap
//! definition, so what `--help` says and what the package installs never
//! drift apart. Each binary writes its own when asked (a hidden
//! `--generate-manual DIR` or `generate-manual DIR`);
//! `scripts/package.sh` collects them into the Debian package.

use std::io;
use std::path::Path;

use clap_complete::Shell;

/// Writes `DIR/man/NAME.SECTION` (roff, with a page per subcommand as
/// `NAME-SUB.SECTION`) and completions for bash, zsh and fish under
/// `DIR/completions/` for the command `cmd`.
pub fn write(cmd: clap::Command, section: &str, dir: &Path) -> io::Result<()> {
    let man = dir.join("man");
    let completions = dir.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    let mut cmd = cmd;
    cmd.build();
    page(&cmd, cmd.get_name(), section, &man)?;
    let name = cmd.get_name().to_string();
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd, &name, &completions)?;
    }
    Ok(())
}

/// The page of `cmd` as `file_name.section`, then one per visible
/// subcommand.
fn page(cmd: &clap::Command, file_name: &str, section: &str, dir: &Path) -> io::Result<()> {
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .title(file_name.to_uppercase())
        .section(section)
        .render(&mut out)?;
    std::fs::write(dir.join(format!("{file_name}.{section}")), out)?;
    // clap's own `help` subcommand says nothing a page does not.
    let pages = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help");
    for sub in pages {
        let sub_name = format!("{file_name}-{}", sub.get_name());
        page(sub, &sub_name, section, dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    #[command(name = "demo", version, about = "A demo command")]
    struct Demo {
        /// A flag.
        #[arg(long)]
        flag: bool,
        #[command(subcommand)]
        sub: Option<Sub>,
    }

    #[derive(clap::Subcommand)]
    enum Sub {
        /// Does one thing.
        One,
        #[command(hide = true)]
        Secret,
    }

    #[test]
    fn pages_and_completions_come_from_the_definition() {
        use clap::CommandFactory;
        let dir = std::env::temp_dir().join(format!("uniplane-manual-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write(Demo::command(), "1", &dir).unwrap();
        let page = std::fs::read_to_string(dir.join("man/demo.1")).unwrap();
        assert!(page.contains("A demo command"), "{page}");
        assert!(page.contains("flag"), "{page}");
        let one = std::fs::read_to_string(dir.join("man/demo-one.1")).unwrap();
        assert!(one.contains("Does one thing"), "{one}");
        assert!(
            !dir.join("man/demo-secret.1").exists(),
            "hidden stays hidden"
        );
        for f in ["demo.bash", "_demo", "demo.fish"] {
            let text = std::fs::read_to_string(dir.join("completions").join(f)).unwrap();
            assert!(text.contains("flag"), "{f}: {text}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
