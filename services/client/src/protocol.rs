//! The control protocol: JSON lines over the daemon's Unix socket (for
//! applications and the CLI) and over TCP between peer daemons.
//!
//! Each request is one JSON object on one line with an `op` field; each
//! answer is one line, `{"ok": true, "result": …}` or `{"ok": false,
//! "error": {"kind": …, "message": …}}`. A malformed request gets an error
//! answer and changes nothing. Lines are limited to [`MAX_LINE`] bytes.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};
use uniplane_dataplane::Uid;

/// Longest control line accepted, in bytes.
pub const MAX_LINE: usize = 64 * 1024;

/// `req_flag` of an in-band CLOSE (a port-layout CLOSE from one end of a
/// connection to the other, on the data path): the sender closes the
/// connection. Everything it sent before travels ahead of it.
pub const CLOSE_FIN: u8 = 0;
/// `req_flag` of the in-band CLOSE that acknowledges a [`CLOSE_FIN`]: once
/// it arrives, the closing end asks the daemon to remove the connection.
pub const CLOSE_ACK: u8 = 1;

/// Reads one line of at most [`MAX_LINE`] bytes (one more is read to tell
/// an oversized line); returns the bytes read, 0 at the end of the stream.
pub async fn read_line<R>(reader: &mut R, line: &mut Vec<u8>) -> std::io::Result<usize>
where
    R: tokio::io::AsyncBufRead + Unpin,
{
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    line.clear();
    reader
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', line)
        .await
}

/// Writes `value` as one JSON line.
pub async fn write_line<W, T>(writer: &mut W, value: &T) -> std::io::Result<()>
where
    W: tokio::io::AsyncWrite + Unpin,
    T: Serialize,
{
    use tokio::io::AsyncWriteExt;
    let mut out = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    out.push(b'\n');
    writer.write_all(&out).await
}

/// A UID as text (`10.0.0.7:3`) in JSON.
pub mod uid_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use uniplane_dataplane::Uid;

    /// Writes a UID as its text form.
    pub fn serialize<S: Serializer>(uid: &Uid, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(uid)
    }

    /// Reads a UID from its text form.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Uid, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A connection as the control protocol names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConnSpec {
    /// The connecting resource.
    #[serde(with = "uid_text")]
    pub src: Uid,
    /// Its port.
    pub src_port: u16,
    /// The accepting resource.
    #[serde(with = "uid_text")]
    pub dst: Uid,
    /// Its port.
    pub dst_port: u16,
}

/// A request from an application or the CLI. A field the request does
/// not have is refused, and the error names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", from = "RequestIn")]
pub enum Request {
    /// The daemon's identity, uptime, ports, peers.
    Status,
    /// Local resources and their device IDs.
    Resources,
    /// The interconnection table and the routes computed over it.
    Routes,
    /// Open connections.
    Connections,
    /// The forwarding table, ACL and counters of one device's port.
    Tables {
        /// Device number.
        device: u16,
    },
    /// Counters of every port and peer.
    Stats,
    /// Prometheus text of every metric.
    Metrics,
    /// Shows the scheduling policy of a device's port, or sets it.
    Policy {
        /// Device number.
        device: u16,
        /// `rr`, `weighted:1:2:…` or `strict:CLASS/WEIGHT,…`; none to show.
        #[serde(default)]
        set: Option<String>,
    },
    /// Shows the traffic classes and how they share each peer's tunnels;
    /// with `id`, first changes that class's weight or priority (live, on
    /// every peer's underlay).
    Class {
        /// The class to change; none to show.
        #[serde(default)]
        id: Option<u8>,
        /// Its new weight (≥ 1).
        #[serde(default)]
        weight: Option<u32>,
        /// Its new priority (0 is served first).
        #[serde(default)]
        priority: Option<u8>,
    },
    /// Every table and counter of every port the daemon owns, read back
    /// from the forwarding plane (never from the daemon's own copy).
    PlaneDump,
    /// Registers the calling process as a resource; the answer gives its
    /// UID and how to reach its data path.
    Attach {
        /// A name for listings.
        name: String,
    },
    /// Accepts connections to `port` of the attached resource.
    Listen {
        /// The port.
        port: u16,
    },
    /// Stops accepting on `port`.
    Unlisten {
        /// The port.
        port: u16,
    },
    /// Opens a connection from the attached resource.
    Connect {
        /// Local port (0: the daemon picks one).
        #[serde(default)]
        src_port: u16,
        /// Destination resource.
        #[serde(with = "uid_text")]
        dst: Uid,
        /// Destination port.
        dst_port: u16,
        /// Traffic class (tunnel) for cross-server paths.
        #[serde(default)]
        class: u8,
    },
    /// Closes a connection of the attached resource.
    Close {
        /// The connection.
        conn: ConnSpec,
    },
    /// Claims `name` for the attached resource in the cluster's directory
    /// (`[registry] kind = "etcd"`) until the session ends.
    Register {
        /// The name (no `/`, no white space, at most 128 bytes).
        name: String,
    },
    /// The UID a name stands for: in the cluster's directory, or among
    /// this daemon's resources when it has none.
    Resolve {
        /// The name.
        name: String,
    },
    /// The cluster's directory: servers, their leases, names; and how
    /// this daemon's own claims stand.
    Directory,
    /// Maps the memory of a local host memory device into the attached
    /// process, as the access rules allow (READ; WRTE for a writable
    /// mapping); the answer ([`Mapping`]) says how to claim it.
    Map {
        /// The device number.
        device: u16,
    },
    /// Makes `len` zeroed bytes of shared memory, region `id` of the
    /// attached process, that its peers on this server may map
    /// ([`Request::MapShared`]) as the access rules allow them READ (and
    /// WRTE, when `peers_write`) on the process; the answer
    /// ([`Mapping`], `device` the process's own) says how to claim the
    /// process's writable mapping. Withdrawn from everyone when a borrower
    /// loses its grant or ends, or the process's session ends.
    Share {
        /// The region's number among the process's.
        id: u16,
        /// Bytes.
        len: u64,
        /// Whether peers may write it (as the rules allow).
        #[serde(default)]
        peers_write: bool,
    },
    /// Withdraws region `id` the attached process shares, from every
    /// borrower; the process keeps its bytes.
    Unshare {
        /// The region.
        id: u16,
    },
    /// Maps region `id` that local process `owner` shares; the answer
    /// ([`Mapping`], `device` the owner's) says how to claim it.
    MapShared {
        /// The lending process.
        #[serde(with = "uid_text")]
        owner: Uid,
        /// The region.
        id: u16,
    },
}

/// Reads one control request line as the daemon does (after it has
/// refused lines longer than [`MAX_LINE`]). Whatever the bytes, the result
/// is a request or an error, never a panic.
pub fn decode_request(line: &[u8]) -> Result<Request, serde_json::Error> {
    serde_json::from_slice(line)
}

/// [`Request`] as it is read. serde ignores fields beside the tag of a
/// variant without fields, so here those variants are written `{}` and
/// refuse unknown fields like every other; the connection of `close` is
/// read strictly too.
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
enum RequestIn {
    Status {},
    Resources {},
    Routes {},
    Connections {},
    Tables {
        device: u16,
    },
    Stats {},
    Metrics {},
    Policy {
        device: u16,
        #[serde(default)]
        set: Option<String>,
    },
    Class {
        #[serde(default)]
        id: Option<u8>,
        #[serde(default)]
        weight: Option<u32>,
        #[serde(default)]
        priority: Option<u8>,
    },
    PlaneDump {},
    Attach {
        name: String,
    },
    Listen {
        port: u16,
    },
    Unlisten {
        port: u16,
    },
    Connect {
        #[serde(default)]
        src_port: u16,
        #[serde(with = "uid_text")]
        dst: Uid,
        dst_port: u16,
        #[serde(default)]
        class: u8,
    },
    Close {
        conn: ConnSpecIn,
    },
    Register {
        name: String,
    },
    Resolve {
        name: String,
    },
    Directory {},
    Map {
        device: u16,
    },
    Share {
        id: u16,
        len: u64,
        #[serde(default)]
        peers_write: bool,
    },
    Unshare {
        id: u16,
    },
    MapShared {
        #[serde(with = "uid_text")]
        owner: Uid,
        id: u16,
    },
}

/// [`ConnSpec`] as a control request carries it: no other fields.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConnSpecIn {
    #[serde(with = "uid_text")]
    src: Uid,
    src_port: u16,
    #[serde(with = "uid_text")]
    dst: Uid,
    dst_port: u16,
}

impl From<RequestIn> for Request {
    fn from(r: RequestIn) -> Request {
        match r {
            RequestIn::Status {} => Request::Status,
            RequestIn::Resources {} => Request::Resources,
            RequestIn::Routes {} => Request::Routes,
            RequestIn::Connections {} => Request::Connections,
            RequestIn::Tables { device } => Request::Tables { device },
            RequestIn::Stats {} => Request::Stats,
            RequestIn::Metrics {} => Request::Metrics,
            RequestIn::Policy { device, set } => Request::Policy { device, set },
            RequestIn::Class {
                id,
                weight,
                priority,
            } => Request::Class {
                id,
                weight,
                priority,
            },
            RequestIn::PlaneDump {} => Request::PlaneDump,
            RequestIn::Attach { name } => Request::Attach { name },
            RequestIn::Listen { port } => Request::Listen { port },
            RequestIn::Unlisten { port } => Request::Unlisten { port },
            RequestIn::Connect {
                src_port,
                dst,
                dst_port,
                class,
            } => Request::Connect {
                src_port,
                dst,
                dst_port,
                class,
            },
            RequestIn::Register { name } => Request::Register { name },
            RequestIn::Resolve { name } => Request::Resolve { name },
            RequestIn::Directory {} => Request::Directory,
            RequestIn::Map { device } => Request::Map { device },
            RequestIn::Share {
                id,
                len,
                peers_write,
            } => Request::Share {
                id,
                len,
                peers_write,
            },
            RequestIn::MapShared { owner, id } => Request::MapShared { owner, id },
            RequestIn::Unshare { id } => Request::Unshare { id },
            RequestIn::Close { conn } => Request::Close {
                conn: ConnSpec {
                    src: conn.src,
                    src_port: conn.src_port,
                    dst: conn.dst,
                    dst_port: conn.dst_port,
                },
            },
        }
    }
}

/// A request between peer daemons.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum PeerRequest {
    /// First line on a peer channel: who is calling, and a fresh nonce
    /// (32 hex digits) the answer's proof must cover.
    Hello {
        /// The caller's server ID.
        server: Ipv4Addr,
        /// The caller's name.
        name: String,
        /// The caller's nonce.
        nonce: String,
    },
    /// Second line: the caller's proof that it holds the cluster secret
    /// (32 hex digits). Every later line is sealed.
    Prove {
        /// The proof.
        proof: String,
    },
    /// Liveness; answered by nothing (the other side sends its own).
    Heartbeat,
    /// Asks the peer to admit a connection to one of its resources.
    Connect {
        /// The connection (src on the caller's server).
        conn: ConnSpec,
        /// Traffic class.
        class: u8,
    },
    /// The connection is closed on the caller's side.
    Close {
        /// The connection.
        conn: ConnSpec,
        /// Why, as a wire status code (`Closed` when absent): the far
        /// end's owner is told the same.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u8>,
    },
}

/// The error half of an answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// A stable, machine-readable kind (`denied`, `refused`, `bad-request`, …).
    pub kind: String,
    /// What happened, for people.
    pub message: String,
}

/// One answer line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// Whether the request succeeded.
    pub ok: bool,
    /// The result, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// The error, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

impl Answer {
    /// A success with `result`.
    pub fn ok(result: serde_json::Value) -> Answer {
        Answer {
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    /// A failure.
    pub fn err(kind: &str, message: impl Into<String>) -> Answer {
        Answer {
            ok: false,
            result: None,
            error: Some(ErrorBody {
                kind: kind.to_owned(),
                message: message.into(),
            }),
        }
    }
}

/// What `attach` answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attached {
    /// The UID given to the caller.
    #[serde(with = "uid_text")]
    pub uid: Uid,
    /// The daemon's own UID (device 0), source of notices.
    #[serde(with = "uid_text")]
    pub daemon: Uid,
    /// Unix socket of the data path.
    pub data_socket: String,
    /// Token to present on the data socket.
    pub token: u64,
}

/// The answer to [`Request::Map`]: the mapping waits on the data socket
/// for the token, and comes as two descriptors (the memory, read-only
/// unless `writable`, and its grant word) after a [`MapHello`].
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Mapping {
    /// The device number.
    pub device: u16,
    /// Bytes of the memory.
    pub len: u64,
    /// Whether the mapping may be written.
    pub writable: bool,
    /// Unix socket to claim it on.
    pub data_socket: String,
    /// Token to present there.
    pub token: u64,
}

/// What the daemon sends with a mapping's descriptors: a magic word and
/// the memory's length, checked against the [`Mapping`] answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapHello {
    /// Bytes of the memory.
    pub len: u64,
}

impl MapHello {
    const MAGIC: u64 = u64::from_be_bytes(*b"UNIPMAP1");
    /// Bytes on the wire.
    pub const BYTES: usize = 16;

    /// The hello's bytes.
    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[..8].copy_from_slice(&Self::MAGIC.to_le_bytes());
        b[8..].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Reads a hello; `None` unless it is exactly one.
    pub fn decode(b: &[u8]) -> Option<MapHello> {
        if b.len() != Self::BYTES || b[..8] != Self::MAGIC.to_le_bytes() {
            return None;
        }
        Some(MapHello {
            len: u64::from_le_bytes(b[8..].try_into().ok()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_hello_reads_back_and_anything_else_is_refused() {
        let h = MapHello { len: 1 << 30 };
        assert_eq!(MapHello::decode(&h.encode()), Some(h));
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert_eq!(MapHello::decode(&bad), None);
        assert_eq!(MapHello::decode(&h.encode()[..15]), None);
        assert_eq!(MapHello::decode(&[]), None);
    }

    #[test]
    fn requests_are_tagged_json() {
        let r: Request =
            serde_json::from_str(r#"{"op":"connect","dst":"10.0.0.7:3","dst_port":80}"#).unwrap();
        assert_eq!(
            r,
            Request::Connect {
                src_port: 0,
                dst: "10.0.0.7:3".parse().unwrap(),
                dst_port: 80,
                class: 0
            }
        );
        assert_eq!(
            serde_json::to_string(&Request::Status).unwrap(),
            r#"{"op":"status"}"#
        );
    }

    #[test]
    fn malformed_requests_are_errors_not_panics() {
        for bad in [
            "",
            "{}",
            r#"{"op":"fly"}"#,
            r#"{"op":"connect","dst":"10.0.0.7","dst_port":80}"#,
            r#"{"op":"tables","device":70000}"#,
            r#"{"op":"connect","dst":"10.0.0.7:3","dst_port":80,"bogus":1}"#,
            "[1,2,3]",
        ] {
            assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
        }
    }

    /// One request of every kind. The `match` names every variant, so a
    /// new one does not compile until it is added here (and to
    /// `RequestIn`).
    fn one_of_each() -> Vec<Request> {
        let conn = ConnSpec {
            src: "10.0.0.1:2".parse().unwrap(),
            src_port: 49152,
            dst: "10.0.0.7:3".parse().unwrap(),
            dst_port: 80,
        };
        let all = vec![
            Request::Status,
            Request::Resources,
            Request::Routes,
            Request::Connections,
            Request::Tables { device: 1 },
            Request::Stats,
            Request::Metrics,
            Request::Policy {
                device: 1,
                set: Some("rr".into()),
            },
            Request::Class {
                id: Some(1),
                weight: Some(3),
                priority: None,
            },
            Request::PlaneDump,
            Request::Attach { name: "app".into() },
            Request::Listen { port: 80 },
            Request::Unlisten { port: 80 },
            Request::Connect {
                src_port: 5,
                dst: conn.dst,
                dst_port: 80,
                class: 1,
            },
            Request::Close { conn },
            Request::Register {
                name: "job.rank0".into(),
            },
            Request::Resolve {
                name: "job.rank0".into(),
            },
            Request::Directory,
            Request::Map { device: 2 },
            Request::Share {
                id: 1,
                len: 4096,
                peers_write: true,
            },
            Request::Unshare { id: 1 },
            Request::MapShared {
                owner: "10.0.0.1:5".parse().unwrap(),
                id: 1,
            },
        ];
        for r in &all {
            match r {
                Request::Status
                | Request::Resources
                | Request::Routes
                | Request::Connections
                | Request::Tables { .. }
                | Request::Stats
                | Request::Metrics
                | Request::Policy { .. }
                | Request::Class { .. }
                | Request::PlaneDump
                | Request::Attach { .. }
                | Request::Listen { .. }
                | Request::Unlisten { .. }
                | Request::Connect { .. }
                | Request::Close { .. }
                | Request::Register { .. }
                | Request::Resolve { .. }
                | Request::Directory
                | Request::Map { .. }
                | Request::Share { .. }
                | Request::Unshare { .. }
                | Request::MapShared { .. } => {}
            }
        }
        all
    }

    #[test]
    fn every_request_reads_back_as_written() {
        for r in one_of_each() {
            let line = serde_json::to_vec(&r).unwrap();
            assert_eq!(decode_request(&line).unwrap(), r);
        }
    }

    #[test]
    fn finding9_unknown_fields_refused_in_every_request() {
        for r in one_of_each() {
            let mut v = serde_json::to_value(&r).unwrap();
            v["bogus"] = 1.into();
            let err = decode_request(&serde_json::to_vec(&v).unwrap())
                .expect_err(&format!("{v} accepted"))
                .to_string();
            assert!(err.contains("unknown field `bogus`"), "{v}: {err}");
        }
        let close = r#"{"op":"close","conn":{"src":"10.0.0.1:2","src_port":1,
            "dst":"10.0.0.7:3","dst_port":2,"bogus":1}}"#;
        let err = decode_request(close.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("unknown field `bogus`"), "{err}");
    }
}
