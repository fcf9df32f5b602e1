//! Where the dense layers run: the daemons' configuration text for each
//! placement. The application is the same for all of them: it calls the
//! entry device ([`Rendered::entry`]) and gets the last layer's output.
//!
//! ```text
//!  single          server A: device 2 = layers 0..n
//!  split connect   server A: device 2 = layers 0..cut ─next─▶ device 3 = layers cut..n
//!                            (the engine carries it over device 3's emulated path:
//!                             PIO mailbox up to 256 B, FPGA Connect above)
//!  split ltl|tcp   server A: device 2 = layers 0..cut ─next─▶ server B: device 3 = layers cut..n
//!                            (over the tunnel between the two daemons, stack ltl or tcp)
//! ```

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use crate::Model;

/// The path between the two halves of a split model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Both on one server: the engine to the next device's emulated PCIe
    /// path (DUA's FPGA Connect).
    Connect,
    /// Two servers joined by an LTL tunnel.
    Ltl,
    /// Two servers joined by a TCP tunnel.
    Tcp,
}

impl Path {
    /// Its name (`connect`, `ltl`, `tcp`).
    pub fn name(self) -> &'static str {
        match self {
            Path::Connect => "connect",
            Path::Ltl => "ltl",
            Path::Tcp => "tcp",
        }
    }

    /// The path named `name`.
    pub fn parse(name: &str) -> Result<Path, String> {
        match name {
            "connect" => Ok(Path::Connect),
            "ltl" => Ok(Path::Ltl),
            "tcp" => Ok(Path::Tcp),
            other => Err(format!("`{other}`: a path is connect, ltl or tcp")),
        }
    }
}

/// Where the layers run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Every layer in one endpoint.
    Single,
    /// Layers `0..cut` in one endpoint, `cut..n` in a second, joined by
    /// a path.
    Split {
        /// The first layer of the second endpoint.
        cut: usize,
        /// What joins them.
        path: Path,
    },
}

/// The two servers of a placement across servers: their ids, where each
/// daemon listens for its peer (control) and for tunnels, and the
/// cluster secret both read.
#[derive(Clone, Debug)]
pub struct Servers {
    /// Server A (the entry) and server B.
    pub ids: [Ipv4Addr; 2],
    /// Each daemon's peer (control) port on 127.0.0.1.
    pub peer_ports: [u16; 2],
    /// Each daemon's tunnel port on 127.0.0.1.
    pub tunnel_ports: [u16; 2],
    /// The cluster secret file.
    pub secret: PathBuf,
}

/// A placement's configuration: one text per daemon and the entry device.
#[derive(Clone, Debug)]
pub struct Rendered {
    /// The device the application calls (`SERVER:DEVICE`).
    pub entry: String,
    /// Each daemon's configuration (server A's first).
    pub configs: Vec<String>,
}

/// The device of the entry (layer 0) on server A.
pub const ENTRY_DEVICE: u16 = 2;
/// The device of the second half (server A or B).
pub const SECOND_DEVICE: u16 = 3;

/// A `dense` kernel device computing `layers` of `model`.
fn dense(
    out: &mut String,
    model: &Model,
    device: u16,
    layers: (usize, usize),
    next: Option<String>,
) {
    let dims: Vec<String> = model.dims().iter().map(usize::to_string).collect();
    let _ = write!(
        out,
        "\n[[devices]]\nname = \"dense-{}-{}\"\nkind = \"kernel\"\ndevice = {device}\n\
         backend = \"emulated\"\nfunction = \"dense\"\n\
         params = {{ dims = \"{}\", layers = \"{}..{}\", seed = \"{}\" }}\n",
        layers.0,
        layers.1,
        dims.join(","),
        layers.0,
        layers.1,
        model.seed(),
    );
    if let Some(next) = next {
        let _ = writeln!(out, "next = \"{next}\"");
    }
}

/// The configuration of `placement` for `model`; `servers` is needed by a
/// split across servers (ltl, tcp) and unused otherwise.
pub fn render(
    model: &Model,
    placement: Placement,
    servers: Option<&Servers>,
) -> Result<Rendered, String> {
    let n = model.dims().len() - 1;
    let local = "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n".to_string();
    match placement {
        Placement::Single => {
            let mut a = local;
            dense(&mut a, model, ENTRY_DEVICE, (0, n), None);
            Ok(Rendered {
                entry: format!("127.0.0.1:{ENTRY_DEVICE}"),
                configs: vec![a],
            })
        }
        Placement::Split { cut, .. } if cut == 0 || cut >= n => Err(format!(
            "a split at layer {cut}: each half needs a layer of the model's {n} (1..{n})"
        )),
        Placement::Split {
            cut,
            path: Path::Connect,
        } => {
            let mut a = local;
            let next = format!("127.0.0.1:{SECOND_DEVICE}");
            dense(&mut a, model, ENTRY_DEVICE, (0, cut), Some(next));
            dense(&mut a, model, SECOND_DEVICE, (cut, n), None);
            Ok(Rendered {
                entry: format!("127.0.0.1:{ENTRY_DEVICE}"),
                configs: vec![a],
            })
        }
        Placement::Split { cut, path } => {
            let s = servers.ok_or("a split across servers needs their addresses")?;
            let server = |i: usize| {
                let o = 1 - i;
                format!(
                    "[server]\nid = \"{}\"\npeer_listen = \"127.0.0.1:{}\"\n\n\
                     [[stacks]]\nname = \"{stack}\"\nlisten = \"127.0.0.1:{}\"\n\n\
                     [[peers]]\nserver = \"{}\"\naddress = \"127.0.0.1:{}\"\n\
                     tunnel = \"127.0.0.1:{}\"\nstack = \"{stack}\"\n\n\
                     [policy]\ndefault = \"allow\"\n\n[cluster]\nsecret = \"{}\"\n",
                    s.ids[i],
                    s.peer_ports[i],
                    s.tunnel_ports[i],
                    s.ids[o],
                    s.peer_ports[o],
                    s.tunnel_ports[o],
                    s.secret.display(),
                    stack = path.name(),
                )
            };
            let (mut a, mut b) = (server(0), server(1));
            let next = format!("{}:{SECOND_DEVICE}", s.ids[1]);
            dense(&mut a, model, ENTRY_DEVICE, (0, cut), Some(next));
            dense(&mut b, model, SECOND_DEVICE, (cut, n), None);
            Ok(Rendered {
                entry: format!("{}:{ENTRY_DEVICE}", s.ids[0]),
                configs: vec![a, b],
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_names_the_next_device_and_its_half_of_the_layers() {
        let model = Model::new("768,512,256,128,1", 7, 8).unwrap();
        let r = render(
            &model,
            Placement::Split {
                cut: 2,
                path: Path::Connect,
            },
            None,
        )
        .unwrap();
        assert_eq!(r.entry, "127.0.0.1:2");
        assert_eq!(r.configs.len(), 1);
        let c = &r.configs[0];
        assert!(c.contains("layers = \"0..2\", seed = \"7\" }\nnext = \"127.0.0.1:3\""));
        assert!(c.contains("layers = \"2..4\""));
        let servers = Servers {
            ids: [Ipv4Addr::new(10, 20, 0, 1), Ipv4Addr::new(10, 20, 0, 2)],
            peer_ports: [1, 2],
            tunnel_ports: [3, 4],
            secret: "key".into(),
        };
        let r = render(
            &model,
            Placement::Split {
                cut: 1,
                path: Path::Ltl,
            },
            Some(&servers),
        )
        .unwrap();
        assert_eq!(r.entry, "10.20.0.1:2");
        assert!(r.configs[0].contains("next = \"10.20.0.2:3\""));
        assert!(r.configs[0].contains("stack = \"ltl\""));
        assert!(r.configs[1].contains("layers = \"1..4\""));
    }

    #[test]
    fn a_split_with_an_empty_half_is_refused() {
        let model = Model::new("768,512,256,128,1", 7, 8).unwrap();
        for cut in [0, 4, 5] {
            let split = Placement::Split {
                cut,
                path: Path::Connect,
            };
            assert!(render(&model, split, None).is_err(), "cut {cut}");
        }
        assert!(render(
            &model,
            Placement::Split {
                cut: 2,
                path: Path::Tcp
            },
            None
        )
        .is_err());
        assert_eq!(Path::parse("ltl"), Ok(Path::Ltl));
        assert!(Path::parse("pcie").is_err());
    }
}
