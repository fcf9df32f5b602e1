use super::*;
use crate::library;

/// What a kernel emitted, in order.
#[derive(Default)]
struct Collect(Vec<(u16, Result<Vec<u8>, KernelError>)>);

impl Emit for Collect {
    fn answer(&mut self, conn: u16, payload: &[u8]) {
        self.0.push((conn, Ok(payload.to_vec())));
    }
    fn error(&mut self, conn: u16, error: KernelError) {
        self.0.push((conn, Err(error)));
    }
}

/// Twelve rules, one a lookbehind that `regex-automata` refuses.
const RULES: &str = r#"
SecRule ARGS "@rx (?i:union\s+select)" "id:100001"
SecRule ARGS "@rx <script[^>]*>" "id:100002"
SecRule ARGS "@rx \.\./" "id:100003"
SecRule ARGS "@rx (?i:sleep\(\s*\d+\s*\))" "id:100004"
SecRule ARGS "@rx ^GET " "id:100005"
SecRule ARGS "@rx /etc/passwd" "id:100006,chain"
    SecRule ARGS "@rx root:" "t:none"
SecRule ARGS "@rx \bor\s+1=1\b" "id:100007"
SecRule ARGS "@rx eval\(" "id:100008"
SecRule ARGS "@rx \$\{jndi:" "id:100009"
SecRule ARGS "@rx (?<!x)cmd\.exe" "id:100010"
SecRule ARGS "@rx onerror\s*=" "id:100011"
"#;

fn rule_set() -> RuleSet {
    let mut set = RuleSet::default();
    set.parse_file("test.conf", RULES);
    assert_eq!(set.patterns.len(), 12);
    set
}

fn params(pairs: &[(&str, &str)]) -> Params {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn config(group: u32, groups: u32) -> StageConfig {
    let g = group.to_string();
    let n = groups.to_string();
    StageConfig::from_params(&params(&[
        ("rules", "unused"),
        ("group", &g),
        ("groups", &n),
        ("seed", "7"),
    ]))
    .unwrap()
}

fn ids(list: &[u32]) -> Vec<PatternId> {
    list.iter()
        .map(|&r| PatternId::new(r, 0).unwrap())
        .collect()
}

/// Runs `input` through `stages` in order as a chain does, each answer
/// the next request: the last answer or the first error.
fn through(stages: &mut [Stage], input: &[u8]) -> Result<Vec<u8>, KernelError> {
    let mut message = input.to_vec();
    for stage in stages {
        let mut out = Collect::default();
        stage.on_message(9, &message, &mut out);
        assert_eq!(out.0.len(), 1, "exactly one answer or error per message");
        let (conn, answer) = out.0.remove(0);
        assert_eq!(conn, 9);
        message = answer?;
    }
    Ok(message)
}

#[test]
fn three_stages_answer_the_same_sorted_list_as_one_stage_of_every_rule() {
    let set = rule_set();
    let mut chain: Vec<Stage> = (0..3)
        .map(|g| Stage::from_rules(&config(g, 3), &set).unwrap())
        .collect();
    let mut one = [Stage::from_rules(&config(0, 1), &set).unwrap()];
    let input =
        b"GET /a?q=1 UNION  SELECT x <script src=y> ../../etc/passwd root: sleep( 5 ) or 1=1";
    let list = decode_match_list(&through(&mut chain, input).unwrap()).unwrap();
    assert_eq!(
        list,
        [
            ids(&[100001, 100002, 100003, 100004, 100005, 100006, 100007]),
            vec![PatternId::new(100006, 1).unwrap()],
        ]
        .concat()
    );
    assert_eq!(
        decode_match_list(&through(&mut one, input).unwrap()).unwrap(),
        list
    );
    let nothing = decode_match_list(&through(&mut chain, b"a harmless input").unwrap()).unwrap();
    assert!(nothing.is_empty());
}

#[test]
fn a_middle_stage_forwards_the_input_with_the_ids_carried_so_far() {
    let set = rule_set();
    let mut first = Stage::from_rules(&config(0, 3), &set).unwrap();
    let mut out = Collect::default();
    first.on_message(1, b"eval( ${jndi: onerror =", &mut out);
    let answer = out.0.remove(0).1.unwrap();
    let carried = Carried::decode(&answer).unwrap();
    assert_eq!(carried.input, b"eval( ${jndi: onerror =");
    let group: Vec<PatternId> = first.patterns().to_vec();
    let want: Vec<PatternId> = ids(&[100008, 100009, 100011])
        .into_iter()
        .filter(|id| group.contains(id))
        .collect();
    assert_eq!(carried.ids().collect::<Vec<_>>(), want);
}

#[test]
fn the_split_is_seeded_balanced_and_covers_every_pattern_once() {
    for (count, groups) in [(0, 3), (1, 3), (12, 3), (613, 3), (100, 7)] {
        let split = split(count, groups, 42);
        assert_eq!(split, super::split(count, groups, 42), "deterministic");
        let sizes: Vec<usize> = (0..groups)
            .map(|g| split.iter().filter(|&&x| x == g).count())
            .collect();
        assert_eq!(sizes.iter().sum::<usize>(), count);
        let (lo, hi) = (sizes.iter().min(), sizes.iter().max());
        assert!(hi.unwrap() - lo.unwrap() <= 1, "{sizes:?}");
    }
    assert_ne!(
        split(100, 3, 1),
        split(100, 3, 2),
        "another seed, another split"
    );
}

#[test]
fn a_pattern_the_engine_refuses_is_skipped_and_named() {
    let set = rule_set();
    let stages: Vec<Stage> = (0..3)
        .map(|g| Stage::from_rules(&config(g, 3), &set).unwrap())
        .collect();
    let refused: Vec<&(PatternId, String)> = stages.iter().flat_map(|s| s.refused()).collect();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].0.to_string(), "100010");
    assert!(refused[0].1.contains("look"), "{}", refused[0].1);
    let matched: usize = stages.iter().map(|s| s.patterns().len()).sum();
    assert_eq!(matched + refused.len(), set.patterns.len());
}

#[test]
fn an_input_over_the_limit_is_refused_with_an_error_to_the_sender() {
    let set = rule_set();
    let mut p = params(&[("rules", "unused"), ("group", "0"), ("max_input", "100")]);
    let mut first = Stage::from_rules(&StageConfig::from_params(&p).unwrap(), &set).unwrap();
    let mut out = Collect::default();
    first.on_message(3, &[b'a'; 101], &mut out);
    first.on_message(3, &[b'a'; 100], &mut out);
    assert_eq!(
        out.0[0],
        (
            3,
            Err(KernelError::InputTooLarge {
                len: 101,
                limit: 100
            })
        )
    );
    assert!(out.0[1].1.is_ok(), "the next input is matched");
    // A later stage counts the input, not the IDs before it.
    p.insert("group".into(), "2".into());
    let mut last = Stage::from_rules(&StageConfig::from_params(&p).unwrap(), &set).unwrap();
    let mut message = Vec::new();
    Carried::encode(&ids(&[1, 2, 3]), &[b'a'; 100], &mut message);
    let mut out = Collect::default();
    last.on_message(1, &message, &mut out);
    assert!(out.0[0].1.is_ok());
}

#[test]
fn malformed_carried_messages_are_refused_never_trusted() {
    let set = rule_set();
    let mut middle = Stage::from_rules(&config(1, 3), &set).unwrap();
    for bad in [
        &[][..],
        &[1, 0, 0][..],
        &[1, 0, 0, 0, 7, 7, 7][..],
        &[0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4][..],
    ] {
        let mut out = Collect::default();
        middle.on_message(1, bad, &mut out);
        assert_eq!(
            out.0,
            vec![(1, Err(KernelError::Malformed { len: bad.len() }))]
        );
    }
    // Random bytes: one answer or one error each, no panic.
    let mut x = 0x1234_5678_9abc_def0u64;
    for len in 0..400 {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 7) as u8
            })
            .collect();
        let mut out = Collect::default();
        middle.on_message(2, &bytes, &mut out);
        assert_eq!(out.0.len(), 1);
    }
}

#[test]
fn parameters_are_checked_when_the_configuration_is_read() {
    let check = |pairs: &[(&str, &str)]| library::check("regex-stage", &params(pairs)).unwrap();
    assert!(check(&[("rules", "r"), ("group", "2")]).is_ok());
    let err = |pairs: &[(&str, &str)]| check(pairs).unwrap_err();
    assert!(err(&[("group", "0")]).contains("`rules`"));
    assert!(err(&[("rules", "r")]).contains("`group`"));
    assert!(err(&[("rules", "r"), ("group", "3")]).contains("0..3"));
    assert!(err(&[("rules", "r"), ("group", "0"), ("groups", "0")]).contains("0..0"));
    assert!(err(&[("rules", "r"), ("group", "0"), ("engine", "pcre")]).contains("unknown engine"));
    assert!(err(&[("rules", "r"), ("group", "0"), ("role", "boss")]).contains("unknown role"));
    assert!(err(&[("rules", "r"), ("group", "0"), ("colour", "red")]).contains("`colour`"));
    assert!(err(&[("rules", "r"), ("group", "0"), ("max_input", "70000")]).contains("max_input"));
    let roles: Vec<Role> = (0..3).map(|g| config(g, 3).role).collect();
    assert_eq!(roles, [Role::First, Role::Middle, Role::Last]);
    assert_eq!(config(0, 1).role, Role::Only);
}

#[test]
fn a_stage_whose_rules_cannot_be_read_fails_its_build_with_the_path() {
    let p = params(&[("rules", "/nonexistent/crs-rules"), ("group", "0")]);
    let Some(Err(err)) = library::build("regex-stage", &p) else {
        panic!("built without its rules");
    };
    assert!(err.contains("/nonexistent/crs-rules"), "{err}");
}
