//! Authentication between the daemons of one cluster.
//!
//! Every daemon holds the same 32-byte cluster secret (a file created
//! with mode 0600 by `uniplane cluster keygen`, named by `[cluster]
//! secret`). Nothing a peer says is believed before it has proved that it
//! holds the secret:
//!
//! - **The peer channel** (JSON lines over TCP) opens with a
//!   challenge–response: the dialler's hello carries a fresh nonce; the
//!   listener answers with its own nonce and a proof over both nonces and
//!   both server IDs; the dialler answers with its proof. Each side then
//!   holds a session key derived from the secret and both nonces, and
//!   every later line in either direction carries a tag over the
//!   direction, a sequence number and the line ([`LineSeal`]): a forged,
//!   altered, replayed, reordered or dropped line ends the channel.
//! - **Tunnels** open the same way, inside the tunnel itself (see
//!   [`crate::daemon`]'s tunnel module): the per-tunnel key seals every
//!   frame ([`FrameSeal`]).
//!
//! The MAC is keyed BLAKE3 (a 128-bit tag). A cluster secret proves
//! membership of the cluster, not which member: a daemon holding the
//! secret can claim any server ID. `docs/security.md` states the threat
//! model.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Bytes of a cluster secret.
pub const SECRET_LEN: usize = 32;
/// Bytes of a handshake nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a tag.
pub const TAG_LEN: usize = 16;

/// A key: the cluster secret or one derived from it.
#[derive(Clone)]
pub struct Key([u8; SECRET_LEN]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(…)")
    }
}

/// Why a secret could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file could not be read or written.
    #[error("cluster secret {file}: {source}")]
    Io {
        /// The file.
        file: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// Others may read or replace it.
    #[error(
        "cluster secret {file}: mode {mode:03o}, owner uid {owner}: it must be owned by uid \
         {me} and readable by its owner only (chmod 600 {file})"
    )]
    Exposed {
        /// The file.
        file: String,
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        owner: u32,
        /// Who we are.
        me: u32,
    },
    /// Not 64 hexadecimal digits.
    #[error(
        "cluster secret {file}: expected 64 hexadecimal digits (uniplane cluster keygen FILE)"
    )]
    Malformed {
        /// The file.
        file: String,
    },
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Fills `buf` from the system's random source.
pub fn random(buf: &mut [u8]) {
    // The kernel's generator does not fail once booted; without it no
    // secret or nonce could be made at all.
    getrandom::fill(buf).expect("the system random source");
}

impl Key {
    /// Reads the secret at `path`, refusing a file that others may read
    /// or that belongs to someone else.
    pub fn load(path: &Path) -> Result<Key, SecretError> {
        let file = path.display().to_string();
        let io = |source| SecretError::Io {
            file: file.clone(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        let me = euid();
        if meta.mode() & 0o077 != 0 || meta.uid() != me {
            return Err(SecretError::Exposed {
                file,
                mode: meta.mode() & 0o777,
                owner: meta.uid(),
                me,
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Key::from_hex(text.trim()).ok_or(SecretError::Malformed { file })
    }

    /// Creates a new secret at `path` (mode 0600; an existing file is
    /// never overwritten).
    pub fn generate(path: &Path) -> Result<(), SecretError> {
        let mut bytes = [0u8; SECRET_LEN];
        random(&mut bytes);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| SecretError::Io {
                file: path.display().to_string(),
                source,
            })?;
        writeln!(f, "{}", hex(&bytes)).map_err(|source| SecretError::Io {
            file: path.display().to_string(),
            source,
        })
    }

    /// A key from 64 hexadecimal digits.
    pub fn from_hex(text: &str) -> Option<Key> {
        let bytes = unhex(text)?;
        Some(Key(bytes.try_into().ok()?))
    }

    /// A key for `purpose`, bound to `context` (nonces, server IDs).
    pub fn derive(&self, purpose: &str, context: &[&[u8]]) -> Key {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(purpose.as_bytes());
        h.update(&[0]);
        for c in context {
            h.update(&(c.len() as u32).to_be_bytes());
            h.update(c);
        }
        Key(*h.finalize().as_bytes())
    }

    /// A tag over `parts`, each length-prefixed so no two inputs collide.
    pub fn tag(&self, parts: &[&[u8]]) -> [u8; TAG_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        for p in parts {
            h.update(&(p.len() as u32).to_be_bytes());
            h.update(p);
        }
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
        out
    }

    /// A raw hasher keyed with this key, for hot paths that feed it
    /// fixed-layout input themselves.
    pub fn hasher(&self) -> blake3::Hasher {
        blake3::Hasher::new_keyed(&self.0)
    }
}

/// Compares two tags in time independent of where they differ.
pub fn tags_equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A fresh nonce.
pub fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    random(&mut n);
    n
}

/// Lower-case hexadecimal.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// Bytes from hexadecimal; `None` for odd lengths or other characters.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    let t = text.as_bytes();
    if !t.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    t.chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// The proofs of a peer-channel or tunnel handshake: each side proves it
/// holds the secret over both nonces and both ends' names, so a proof is
/// good for one handshake only and cannot be reflected back.
pub struct Handshake {
    secret: Key,
    kind: &'static str,
    dialler: Vec<u8>,
    listener: Vec<u8>,
    dialler_nonce: [u8; NONCE_LEN],
    listener_nonce: [u8; NONCE_LEN],
}

impl Handshake {
    /// A handshake of `kind` ("peer" or "tunnel") between the named ends.
    pub fn new(
        secret: &Key,
        kind: &'static str,
        dialler: &[u8],
        listener: &[u8],
        dialler_nonce: [u8; NONCE_LEN],
        listener_nonce: [u8; NONCE_LEN],
    ) -> Handshake {
        Handshake {
            secret: secret.clone(),
            kind,
            dialler: dialler.to_vec(),
            listener: listener.to_vec(),
            dialler_nonce,
            listener_nonce,
        }
    }

    fn proof(&self, role: &str) -> [u8; TAG_LEN] {
        self.secret.tag(&[
            b"uniplane handshake v1",
            self.kind.as_bytes(),
            role.as_bytes(),
            &self.dialler,
            &self.listener,
            &self.dialler_nonce,
            &self.listener_nonce,
        ])
    }

    /// The listener's proof.
    pub fn listener_proof(&self) -> [u8; TAG_LEN] {
        self.proof("listener")
    }

    /// The dialler's proof.
    pub fn dialler_proof(&self) -> [u8; TAG_LEN] {
        self.proof("dialler")
    }

    /// The key of the session this handshake opens.
    pub fn session_key(&self) -> Key {
        self.secret.derive(
            self.kind,
            &[
                &self.dialler,
                &self.listener,
                &self.dialler_nonce,
                &self.listener_nonce,
            ],
        )
    }
}

/// Why a sealed line or frame was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// No tag, or not in the expected form.
    #[error("unsealed or malformed")]
    Malformed,
    /// The tag does not match: forged, altered, replayed or out of order.
    #[error("authentication failed")]
    BadTag,
}

/// Seals the lines of one direction-pair of an ordered channel: each line
/// is `TAG SP JSON`, the tag covering the direction, a sequence number and
/// the JSON, so lines cannot be forged, altered, replayed, reordered or
/// dropped unnoticed.
pub struct LineSeal {
    key: Key,
    dialler: bool,
    sent: u64,
    received: u64,
}

impl LineSeal {
    /// The seal of the dialling (`dialler = true`) or listening end.
    pub fn new(key: Key, dialler: bool) -> LineSeal {
        LineSeal {
            key,
            dialler,
            sent: 0,
            received: 0,
        }
    }

    fn tag(&self, from_dialler: bool, seq: u64, body: &[u8]) -> [u8; TAG_LEN] {
        let dir: &[u8] = if from_dialler { b"d" } else { b"l" };
        self.key.tag(&[dir, &seq.to_be_bytes(), body])
    }

    /// The line to send for `body` (no newline in `body`; none added).
    pub fn seal(&mut self, body: &[u8]) -> Vec<u8> {
        let tag = self.tag(self.dialler, self.sent, body);
        self.sent += 1;
        let mut line = hex(&tag).into_bytes();
        line.push(b' ');
        line.extend_from_slice(body);
        line
    }

    /// The body of a received line, if its tag is good.
    pub fn open<'a>(&mut self, line: &'a [u8]) -> Result<&'a [u8], SealError> {
        let hex_len = TAG_LEN * 2;
        if line.len() <= hex_len || line[hex_len] != b' ' {
            return Err(SealError::Malformed);
        }
        let tag = std::str::from_utf8(&line[..hex_len])
            .ok()
            .and_then(unhex)
            .ok_or(SealError::Malformed)?;
        let body = &line[hex_len + 1..];
        let want = self.tag(!self.dialler, self.received, body);
        if !tags_equal(&tag, &want) {
            return Err(SealError::BadTag);
        }
        self.received += 1;
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> Key {
        Key([b; SECRET_LEN])
    }

    #[test]
    fn hex_round_trips_and_refuses_junk() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(unhex(&hex(&b)).unwrap(), b);
        assert!(unhex("abc").is_none());
        assert!(unhex("zz").is_none());
        assert!(Key::from_hex(&"ab".repeat(31)).is_none());
        assert!(Key::from_hex(&"ab".repeat(32)).is_some());
    }

    #[test]
    fn proofs_differ_by_role_secret_and_nonce() {
        let h = |k: &Key, n: u8| Handshake::new(k, "peer", b"a", b"b", [n; 16], [2; 16]);
        let a = h(&key(1), 1);
        assert_ne!(a.listener_proof(), a.dialler_proof());
        assert_ne!(a.listener_proof(), h(&key(2), 1).listener_proof());
        assert_ne!(a.listener_proof(), h(&key(1), 3).listener_proof());
        assert_eq!(a.session_key().0, h(&key(1), 1).session_key().0);
    }

    #[test]
    fn sealed_lines_open_once_in_order_and_only_unaltered() {
        let mut d = LineSeal::new(key(7), true);
        let mut l = LineSeal::new(key(7), false);
        let one = d.seal(b"{\"heartbeat\":null}");
        let two = d.seal(b"{\"close\":1}");
        // Out of order: the second line is refused before the first.
        assert_eq!(l.open(&two), Err(SealError::BadTag));
        assert_eq!(l.open(&one).unwrap(), b"{\"heartbeat\":null}");
        // Replayed.
        assert_eq!(l.open(&one), Err(SealError::BadTag));
        let mut altered = two.clone();
        *altered.last_mut().unwrap() = b']';
        assert_eq!(l.open(&altered), Err(SealError::BadTag));
        assert_eq!(l.open(&two).unwrap(), b"{\"close\":1}");
        // A line reflected back to its sender is refused.
        let back = l.seal(b"x");
        assert_eq!(l.open(&back), Err(SealError::BadTag));
        assert_eq!(d.open(&back).unwrap(), b"x");
        // Wrong key, no tag.
        let mut other = LineSeal::new(key(8), false);
        assert_eq!(other.open(&d.seal(b"y")), Err(SealError::BadTag));
        assert_eq!(l.open(b"{\"heartbeat\":null}"), Err(SealError::Malformed));
    }

    #[test]
    fn secret_files_are_created_private_and_exposed_ones_refused() {
        let dir = std::env::temp_dir().join(format!("uniplane-secret-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("cluster.key");
        Key::generate(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert!(Key::load(&path).is_ok());
        // Never overwritten.
        assert!(Key::generate(&path).is_err());
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Key::load(&path).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::write(dir.join("bad.key"), "xyz").unwrap();
        std::fs::set_permissions(dir.join("bad.key"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        assert!(matches!(
            Key::load(&dir.join("bad.key")),
            Err(SecretError::Malformed { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
