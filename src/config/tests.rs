//! The unit tests of `config`: the file as operators write it, read and checked.

use super::*;

#[test]
fn unknown_field_is_named() {
    let e = Config::parse("[server]\nlisten_addr = \"1.2.3.4:1\"\n").unwrap_err();
    assert!(e.to_string().contains("listen_addr"), "{e}");
}

#[test]
fn invalid_value_is_named() {
    let e = Config::parse("[server]\nlisten = \"nope\"\n").unwrap_err();
    assert!(e.to_string().contains("listen"), "{e}");
}

#[test]
fn shared_rule_needs_resource() {
    let cfg =
        Config::parse("[[rules]]\nbucket = \"b\"\nprefix = \"p/\"\nmode = \"shared\"\n").unwrap();
    let e = cfg.validate().unwrap_err();
    assert!(e.to_string().contains("rules[0].resource"), "{e}");
}

#[test]
fn demo_credential_refuses_public_listen() {
    let cfg = Config::parse("[server]\nlisten = \"0.0.0.0:9000\"\n").unwrap();
    let e = cfg.validate().unwrap_err();
    assert!(e.to_string().contains("server.listen"), "{e}");
}

#[test]
fn cluster_needs_a_shared_backend_and_etcd() {
    let e = Config::parse("[cluster]\netcd_endpoints = [\"http://127.0.0.1:2379\"]\n")
        .unwrap()
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("backend.kind"), "{e}");
    let s3 = "[backend]\nkind = \"s3\"\nendpoint = \"http://127.0.0.1:1\"\n";
    let e = Config::parse(&format!("{s3}[cluster]\n"))
        .unwrap()
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("cluster.etcd_endpoints"), "{e}");
    let ok = format!("{s3}[cluster]\netcd_endpoints = [\"http://127.0.0.1:2379\"]\n");
    let cfg = Config::parse(&ok).unwrap();
    cfg.validate().unwrap();
    let c = cfg.cluster.unwrap();
    assert_eq!((c.prefix.as_str(), c.replica_ttl_ms), ("fencegate/", 5000));
}

#[test]
fn defaults_are_valid() {
    Config::default().validate().unwrap();
}

#[test]
fn the_token_metadata_follows_the_stamp_unless_named() {
    let f = |t: &str| {
        let cfg = Config::parse(t).unwrap();
        cfg.validate().unwrap();
        (cfg.fence.stamp_header(), cfg.fence.token_meta_header())
    };
    let stamp = |s: &str| Some(s.to_string());
    let fencing = "x-amz-meta-fencing-token".to_string();
    assert_eq!(f(""), (stamp("x-amz-meta-fencing-token"), fencing.clone()));
    let renamed = f("[fence]\nstamp_metadata = \"Lease\"\n");
    assert_eq!(
        renamed,
        (stamp("x-amz-meta-lease"), "x-amz-meta-lease".into())
    );
    assert_eq!(f("[fence]\nstamp_metadata = \"\"\n"), (None, fencing));
    let both = "[fence]\nstamp_metadata = \"\"\ntoken_metadata = \"t\"\n";
    assert_eq!(f(both), (None, "x-amz-meta-t".into()));
    let bad = Config::parse("[fence]\nstamp_metadata = \"a b\"\n").unwrap();
    assert!(
        bad.validate()
            .unwrap_err()
            .to_string()
            .contains("stamp_metadata")
    );
}
