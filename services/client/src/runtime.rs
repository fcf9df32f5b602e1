//! Where the daemon's sockets live, and whether that place can be trusted.
//!
//! Whoever can write to the runtime directory can put a socket of their
//! own where the daemon's control socket should be, and so talk to every
//! client as if it were the daemon (or to the daemon as the client). The
//! default under `/tmp` is a name anyone can create first. So:
//!
//! - the daemon creates its directory with mode 0700
//!   ([`prepare_runtime_dir`]), and refuses an existing one that is not
//!   its user's or that group or others may write to;
//! - a client refuses to connect through a directory that is neither its
//!   user's nor root's, or that group or others may write to
//!   ([`check_runtime_dir`]).
//!
//! A symbolic link in place of the directory must belong to the same
//! users (its owner could point it elsewhere); the directory it names is
//! checked like any other.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Control socket file name inside the runtime directory.
pub const CONTROL_SOCKET: &str = "control.sock";
/// Data socket file name inside the runtime directory.
pub const DATA_SOCKET: &str = "data.sock";

/// The runtime directory, where the daemon's sockets are: `configured`
/// when given, else `$UNIPLANE_RUNTIME_DIR`, else
/// `$XDG_RUNTIME_DIR/uniplane`, else `/tmp/uniplane-$UID`. The daemon
/// resolves its own the same way.
pub fn runtime_dir(configured: Option<&Path>) -> PathBuf {
    if let Some(dir) = configured {
        return dir.to_owned();
    }
    if let Some(dir) = std::env::var_os("UNIPLANE_RUNTIME_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(dir).join("uniplane");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/uniplane-{uid}"))
}

/// Where the packaged system service (`uniplaned.service`) keeps its
/// sockets.
pub const SYSTEM_RUNTIME_DIR: &str = "/run/uniplane";

/// The runtime directory a client looks in when told none:
/// `$UNIPLANE_RUNTIME_DIR` when set; else the system service's
/// ([`SYSTEM_RUNTIME_DIR`]) when its control socket is there; else the
/// user's own, as [`runtime_dir`] finds it. (The daemon never picks the
/// system service's by itself: a second daemon must not take it over.)
pub fn client_runtime_dir() -> PathBuf {
    if std::env::var_os("UNIPLANE_RUNTIME_DIR").is_none() {
        let system = Path::new(SYSTEM_RUNTIME_DIR);
        if system.join(CONTROL_SOCKET).exists() {
            return system.to_owned();
        }
    }
    runtime_dir(None)
}

/// Why a runtime directory is not used.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeDirError {
    /// It could not be created or looked at.
    #[error("runtime directory {}: {source}", dir.display())]
    Io {
        /// The directory.
        dir: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// Something other than a directory is in its place.
    #[error(
        "runtime directory {}: not a directory; remove it or choose another runtime directory \
         (runtime.dir, UNIPLANE_RUNTIME_DIR)",
        dir.display()
    )]
    NotADirectory {
        /// The path.
        dir: PathBuf,
    },
    /// It (or the symbolic link in its place) belongs to another user,
    /// who could replace the control socket.
    #[error(
        "runtime directory {}{} is owned by uid {owner} (mode {mode:04o}), not by uid {uid} \
         that runs this process{}: its owner could replace the control socket; remove it, or \
         choose a runtime directory of your own (runtime.dir, UNIPLANE_RUNTIME_DIR)",
        dir.display(),
        if *link { " (a symbolic link)" } else { "" },
        if *root_trusted { " or by root" } else { "" }
    )]
    Foreign {
        /// The directory.
        dir: PathBuf,
        /// Whether it is the symbolic link in its place that is foreign.
        link: bool,
        /// Its owner's uid.
        owner: u32,
        /// Its permission bits.
        mode: u32,
        /// The effective uid of this process.
        uid: u32,
        /// Whether a directory of root's would have done.
        root_trusted: bool,
    },
    /// Group or others may write to it, so they could replace the control
    /// socket.
    #[error(
        "runtime directory {} (owner uid {owner}) has mode {mode:04o}: group or others may \
         write to it and so replace the control socket; `chmod go-w {}`, or choose another \
         runtime directory (runtime.dir, UNIPLANE_RUNTIME_DIR)",
        dir.display(),
        dir.display()
    )]
    Writable {
        /// The directory.
        dir: PathBuf,
        /// Its owner's uid.
        owner: u32,
        /// Its permission bits.
        mode: u32,
    },
}

/// The effective uid of this process.
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// What the daemon does before it binds its sockets: creates `dir` with
/// mode 0700 (its parents as the umask says) when it does not exist, and
/// refuses it unless it is a directory of this process's user that group
/// and others may not write to. An existing directory is never changed.
pub fn prepare_runtime_dir(dir: &Path) -> Result<(), RuntimeDirError> {
    let io_err = |source| RuntimeDirError::Io {
        dir: dir.to_owned(),
        source,
    };
    match std::fs::symlink_metadata(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(io_err)?;
            }
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                // Made by someone else in between: checked below.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                other => other.map_err(io_err)?,
            }
        }
        Err(e) => return Err(io_err(e)),
    }
    let uid = euid();
    check(dir, uid, false)
}

/// What a client does before it connects: refuses `dir` unless it is a
/// directory of this process's user or of root that group and others may
/// not write to.
pub fn check_runtime_dir(dir: &Path) -> Result<(), RuntimeDirError> {
    check(dir, euid(), true)
}

/// Refuses `dir` unless it, and the symbolic link in its place if any,
/// belong to `uid` (or root, when `root_trusted`) and the directory is not
/// writable by group or others.
fn check(dir: &Path, uid: u32, root_trusted: bool) -> Result<(), RuntimeDirError> {
    let io_err = |source| RuntimeDirError::Io {
        dir: dir.to_owned(),
        source,
    };
    let trusted = |owner: u32| owner == uid || (root_trusted && owner == 0);
    let link = std::fs::symlink_metadata(dir).map_err(io_err)?;
    if link.file_type().is_symlink() && !trusted(link.uid()) {
        return Err(RuntimeDirError::Foreign {
            dir: dir.to_owned(),
            link: true,
            owner: link.uid(),
            mode: link.mode() & 0o7777,
            uid,
            root_trusted,
        });
    }
    let meta = std::fs::metadata(dir).map_err(io_err)?;
    if !meta.is_dir() {
        return Err(RuntimeDirError::NotADirectory {
            dir: dir.to_owned(),
        });
    }
    let (owner, mode) = (meta.uid(), meta.mode() & 0o7777);
    if !trusted(owner) {
        return Err(RuntimeDirError::Foreign {
            dir: dir.to_owned(),
            link: false,
            owner,
            mode,
            uid,
            root_trusted,
        });
    }
    if mode & 0o022 != 0 {
        return Err(RuntimeDirError::Writable {
            dir: dir.to_owned(),
            owner,
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A path in the temporary directory that does not exist yet.
    fn fresh(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("uniplane-runtime-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn chmod(dir: &Path, mode: u32) {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn mode(dir: &Path) -> u32 {
        std::fs::metadata(dir).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_configured_runtime_dir_wins() {
        let dir = Path::new("/somewhere/else");
        assert_eq!(runtime_dir(Some(dir)), dir);
    }

    #[test]
    fn finding5_foreign_or_open_runtime_dir_refused() {
        // A fresh directory is made 0700 and passes both checks.
        let dir = fresh("finding5");
        prepare_runtime_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        check_runtime_dir(&dir).unwrap();

        // Writable by others (made so beforehand by anyone): refused by the
        // daemon and the client, and left as it was.
        chmod(&dir, 0o777);
        let err = prepare_runtime_dir(&dir).unwrap_err();
        assert!(
            matches!(err, RuntimeDirError::Writable { mode: 0o777, .. }),
            "{err}"
        );
        let text = err.to_string();
        for part in [
            &dir.display().to_string(),
            "mode 0777",
            "owner uid",
            "chmod go-w",
        ] {
            assert!(text.contains(part), "{part} not in: {text}");
        }
        assert!(matches!(
            check_runtime_dir(&dir),
            Err(RuntimeDirError::Writable { .. })
        ));
        assert_eq!(mode(&dir), 0o777, "an existing directory is never changed");

        // Writable by the group only: refused too; readable by all: fine.
        chmod(&dir, 0o770);
        assert!(prepare_runtime_dir(&dir).is_err());
        chmod(&dir, 0o755);
        prepare_runtime_dir(&dir).unwrap();

        if euid() == 0 {
            // Another user's directory, however closed.
            chmod(&dir, 0o700);
            std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
            let err = prepare_runtime_dir(&dir).unwrap_err();
            assert!(
                matches!(
                    err,
                    RuntimeDirError::Foreign {
                        owner: 65534,
                        link: false,
                        ..
                    }
                ),
                "{err}"
            );
            assert!(err.to_string().contains("owned by uid 65534"), "{err}");
            assert!(check_runtime_dir(&dir).is_err());

            // Our own directory behind another user's symbolic link.
            std::os::unix::fs::chown(&dir, Some(0), Some(0)).unwrap();
            let link = fresh("finding5-link");
            std::os::unix::fs::symlink(&dir, &link).unwrap();
            prepare_runtime_dir(&link).unwrap();
            std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
            let err = prepare_runtime_dir(&link).unwrap_err();
            assert!(
                matches!(err, RuntimeDirError::Foreign { link: true, .. }),
                "{err}"
            );
            assert!(check_runtime_dir(&link).is_err());
            std::fs::remove_file(&link).unwrap();
        } else {
            // Root's directory: not the daemon's (it could not be
            // trusted with our sockets), but a client may use it.
            let root = Path::new("/");
            assert!(matches!(
                prepare_runtime_dir(root),
                Err(RuntimeDirError::Foreign { owner: 0, .. })
            ));
            check_runtime_dir(root).unwrap();
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_in_place_of_the_runtime_dir_is_refused() {
        let path = fresh("file");
        std::fs::write(&path, b"").unwrap();
        assert!(matches!(
            prepare_runtime_dir(&path),
            Err(RuntimeDirError::NotADirectory { .. })
        ));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn missing_parents_are_created() {
        let top = fresh("parents");
        let dir = top.join("a").join("b");
        prepare_runtime_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        std::fs::remove_dir_all(&top).unwrap();
    }
}
