//! Groups and placement: who the endpoints are and where they live.

use std::net::Ipv4Addr;

use uniplane_dataplane::Uid;

/// The endpoints of a group, by rank: rank `i` is the session with UID
/// `members[i]`, listening on the group's port, or — for a hardware rank
/// ([`Group::with_hardware`]) — the kernel device with that UID running
/// the `pgas-target` kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    members: Vec<Uid>,
    /// Which ranks are hardware endpoints.
    hardware: Vec<bool>,
}

impl Group {
    /// A group of these software endpoints, in rank order.
    pub fn new(members: Vec<Uid>) -> Group {
        let hardware = vec![false; members.len()];
        Group { members, hardware }
    }

    /// The same group with `ranks` as hardware endpoints: kernel devices
    /// that answer requests on the one connection each software rank
    /// dials them, never join, never take part in barriers and never
    /// initiate. Ranks outside the group are ignored.
    pub fn with_hardware(mut self, ranks: impl IntoIterator<Item = usize>) -> Group {
        for r in ranks {
            if let Some(h) = self.hardware.get_mut(r) {
                *h = true;
            }
        }
        self
    }

    /// Whether rank `rank` is a hardware endpoint.
    pub fn is_hardware(&self, rank: usize) -> bool {
        self.hardware.get(rank).copied().unwrap_or(false)
    }

    /// The software ranks, in order: those that join and meet in
    /// barriers.
    pub fn software_ranks(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.members.len()).filter(|&r| !self.hardware[r])
    }

    /// Members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether it has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The UID of rank `rank`.
    pub fn uid(&self, rank: usize) -> Option<Uid> {
        self.members.get(rank).copied()
    }

    /// The rank of `uid`.
    pub fn rank_of(&self, uid: Uid) -> Option<usize> {
        self.members.iter().position(|m| *m == uid)
    }
}

/// Where one endpoint of a placement lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedEndpoint {
    /// Its name (the session's name when it attaches).
    pub name: String,
    /// The server (daemon) it attaches to.
    pub server: Ipv4Addr,
    /// The stack between servers for its traffic: `shm` on one server,
    /// `tcp` or `ltl` across.
    pub stack: String,
    /// A hardware endpoint: `name` is a kernel device (`function =
    /// "pgas-target"`) of that server, not a session.
    pub hardware: bool,
}

/// A placement: which endpoints a job has, in rank order, and where each
/// lives; a launcher attaches each to its server's daemon, collects the
/// UIDs and builds the [`Group`].
///
/// The text form has one endpoint per line, `name server [stack] [hw]`,
/// with `#` comments and `name*N` for N replicas (`name0`…); `hw` marks
/// a hardware endpoint, a kernel device of that name:
///
/// ```text
/// # jacobi on two servers, its halo store in a kernel device
/// kernel*2  10.0.0.1
/// kernel*2  10.0.0.2  tcp
/// halo      10.0.0.1  shm  hw
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// Endpoints in rank order.
    pub endpoints: Vec<PlacedEndpoint>,
}

impl Placement {
    /// Reads the text form; the error names the line.
    pub fn parse(text: &str) -> Result<Placement, String> {
        let mut endpoints = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(name), Some(server)) = (words.next(), words.next()) else {
                return Err(format!(
                    "line {}: expected `name server [stack] [hw]`",
                    n + 1
                ));
            };
            let server: Ipv4Addr = server
                .parse()
                .map_err(|_| format!("line {}: bad server {server:?}", n + 1))?;
            let stack = words.next().unwrap_or("shm").to_owned();
            if !matches!(stack.as_str(), "shm" | "tcp" | "ltl") {
                return Err(format!("line {}: unknown stack {stack:?}", n + 1));
            }
            let hardware = match words.next() {
                None => false,
                Some("hw") => true,
                Some(w) => return Err(format!("line {}: {w:?}: expected `hw`", n + 1)),
            };
            if words.next().is_some() {
                return Err(format!("line {}: trailing words", n + 1));
            }
            let (base, replicas) = match name.split_once('*') {
                Some((base, count)) => {
                    let count: usize = count
                        .parse()
                        .ok()
                        .filter(|c| (1..=4096).contains(c))
                        .ok_or_else(|| format!("line {}: bad replica count", n + 1))?;
                    (base, Some(count))
                }
                None => (name, None),
            };
            match replicas {
                None => endpoints.push(PlacedEndpoint {
                    name: base.to_owned(),
                    server,
                    stack: stack.clone(),
                    hardware,
                }),
                Some(count) => {
                    let first = endpoints
                        .iter()
                        .filter(|e| e.name.starts_with(base))
                        .count();
                    for i in 0..count {
                        endpoints.push(PlacedEndpoint {
                            name: format!("{base}{}", first + i),
                            server,
                            stack: stack.clone(),
                            hardware,
                        });
                    }
                }
            }
        }
        Ok(Placement { endpoints })
    }

    /// The hardware ranks.
    pub fn hardware_ranks(&self) -> Vec<usize> {
        (0..self.endpoints.len())
            .filter(|&r| self.endpoints[r].hardware)
            .collect()
    }

    /// The group of these endpoints once attached: `uids` in rank order,
    /// the hardware ranks marked.
    pub fn group(&self, uids: Vec<Uid>) -> Group {
        Group::new(uids).with_hardware(self.hardware_ranks())
    }

    /// The ranks placed on `server`.
    pub fn ranks_on(&self, server: Ipv4Addr) -> Vec<usize> {
        (0..self.endpoints.len())
            .filter(|&r| self.endpoints[r].server == server)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placement_lists_replicas_in_rank_order() {
        let p = Placement::parse(
            "# two servers\nkernel*2 10.0.0.1\nkernel*2 10.0.0.2 tcp\nhost 10.0.0.1 # alone\n",
        )
        .unwrap();
        let names: Vec<_> = p.endpoints.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["kernel0", "kernel1", "kernel2", "kernel3", "host"]);
        assert_eq!(p.endpoints[2].stack, "tcp");
        assert_eq!(p.ranks_on("10.0.0.1".parse().unwrap()), [0, 1, 4]);
        assert!(p.hardware_ranks().is_empty());
    }

    #[test]
    fn a_placement_marks_hardware_endpoints_and_its_group_says_so() {
        let p = Placement::parse("cpu*2 10.0.0.1\nhalo 10.0.0.1 shm hw\n").unwrap();
        assert_eq!(p.hardware_ranks(), [2]);
        let uids = (1..=3)
            .map(|d| Uid::new("10.0.0.1".parse().unwrap(), d))
            .collect();
        let g = p.group(uids);
        assert!(g.is_hardware(2) && !g.is_hardware(0));
        assert_eq!(g.software_ranks().collect::<Vec<_>>(), [0, 1]);
        assert!(Placement::parse("x 10.0.0.1 shm fpga")
            .unwrap_err()
            .contains("line 1"));
    }

    #[test]
    fn a_bad_placement_line_is_named() {
        assert!(Placement::parse("a 10.0.0.1 carrier-pigeon")
            .unwrap_err()
            .contains("line 1"));
        assert!(Placement::parse("\nb nowhere")
            .unwrap_err()
            .contains("line 2"));
        assert!(Placement::parse("c*0 10.0.0.1").is_err());
    }
}
