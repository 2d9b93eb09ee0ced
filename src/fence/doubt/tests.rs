use super::*;

fn doubts() -> (tempfile::TempDir, Doubts) {
    let dir = tempfile::tempdir().unwrap();
    let landing = Landing::open(dir.path(), false).unwrap().landing;
    (dir, Doubts::new(Some(landing)))
}

fn write(d: &Doubts, token: u64, sent: Sent, orderable: bool) -> Write {
    Write {
        token: Some(token),
        resource: d.hash("b/r"),
        object: d.hash("b/k"),
        name: Some("b/k".into()),
        sent,
        orderable,
        alone: false,
    }
}

fn later() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

const PUT: Touch = Touch::Put {
    object: "b/k",
    md5_etag: true,
};
const PUT_OTHER: Touch = Touch::Put {
    object: "b/other",
    md5_etag: true,
};
const DELETE: Touch = Touch::Delete { object: "b/k" };
const COPY: Touch = Touch::Replace { object: "b/k" };

fn admit(guards: &[&str]) -> Verdict {
    Verdict::Admit(guards.iter().map(|g| Box::from(*g)).collect())
}

#[tokio::test]
async fn an_unorderable_doubt_holds_every_newer_token_back() {
    let (_dir, d) = doubts();
    let until = later();
    d.add(&write(&d, 33, Sent::Plain, false), None, until);
    for touch in [
        PUT,
        PUT_OTHER,
        DELETE,
        COPY,
        Touch::Read,
        Touch::Keeps,
        Touch::Other,
    ] {
        assert_eq!(
            d.admits("b/r", 34, touch),
            Verdict::WaitUntil {
                until,
                settles: false
            }
        );
    }
    // Its own token, and other resources, go on.
    assert_eq!(d.admits("b/r", 33, PUT), admit(&[]));
    assert_eq!(d.admits("b/s", 34, PUT), admit(&[]));
    assert!(d.unordered_on("b/r") && d.on("b/r"));
    assert!(!d.on("b/s"));
}

#[tokio::test]
async fn an_if_match_doubt_lets_through_what_the_backend_orders() {
    let (_dir, d) = doubts();
    let until = later();
    d.add(
        &write(&d, 33, Sent::IfMatch("e0".into()), true),
        None,
        until,
    );
    let wait = Verdict::WaitUntil {
        until,
        settles: false,
    };
    let till_settled = Verdict::WaitUntil {
        until,
        settles: true,
    };
    // Its object's next PUT goes, unless it would bring e0 back.
    assert_eq!(d.admits("b/r", 34, PUT), admit(&["e0"]));
    let keyed = Touch::Put {
        object: "b/k",
        md5_etag: false,
    };
    assert_eq!(d.admits("b/r", 34, keyed), wait);
    assert_eq!(d.admits("b/r", 34, DELETE), admit(&[]));
    assert_eq!(d.admits("b/r", 34, COPY), wait);
    assert_eq!(d.admits("b/r", 34, Touch::Keeps), admit(&[]));
    // Unsettled: reads and the resource's other objects wait.
    assert_eq!(d.admits("b/r", 34, Touch::Read), till_settled);
    assert_eq!(d.admits("b/r", 34, PUT_OTHER), till_settled);
    assert_eq!(d.admits("b/r", 34, Touch::Other), till_settled);
    assert!(d.unordered_on("b/r"));
    // The same token is guarded too, and waits for nothing.
    assert_eq!(d.admits("b/r", 33, PUT), admit(&["e0"]));
    assert_eq!(d.admits("b/r", 33, Touch::Read), admit(&[]));
    // Settled (a look found the object changed): they go; a copy, whose
    // ETag could be e0 again, still waits.
    d.settle("b/k", &Sent::IfMatch("other".into()));
    assert_eq!(
        d.admits("b/r", 34, Touch::Read),
        till_settled,
        "another condition"
    );
    d.settle("b/k", &Sent::IfMatch("e0".into()));
    assert_eq!(d.admits("b/r", 34, Touch::Read), admit(&[]));
    assert_eq!(d.admits("b/r", 34, PUT_OTHER), admit(&[]));
    assert_eq!(d.admits("b/r", 34, PUT), admit(&["e0"]));
    assert_eq!(d.admits("b/r", 34, COPY), wait);
    assert!(!d.unordered_on("b/r"));
}

#[tokio::test]
async fn after_a_put_if_absent_in_doubt_a_delete_waits() {
    let (_dir, d) = doubts();
    let until = later();
    d.add(&write(&d, 33, Sent::IfNoneMatch, true), None, until);
    let keyed = Touch::Put {
        object: "b/k",
        md5_etag: false,
    };
    assert_eq!(d.admits("b/r", 34, keyed), admit(&[]));
    assert_eq!(d.admits("b/r", 34, COPY), admit(&[]));
    assert_eq!(
        d.admits("b/r", 34, DELETE),
        Verdict::WaitUntil {
            until,
            settles: false
        }
    );
    d.settle("b/k", &Sent::IfNoneMatch);
    assert_eq!(
        d.admits("b/r", 34, DELETE),
        Verdict::WaitUntil {
            until,
            settles: false
        }
    );
    assert_eq!(d.admits("b/r", 34, Touch::Read), admit(&[]));
    assert!(
        d.unordered_on("b/r"),
        "a successor's delete would free the key"
    );
}

#[tokio::test]
async fn orderable_doubts_with_a_name_are_given_to_the_prober() {
    let (_dir, d) = doubts();
    let mut probes = d.take_probes().unwrap();
    assert!(d.take_probes().is_none(), "taken once");
    d.add(
        &write(&d, 33, Sent::IfMatch("e0".into()), true),
        None,
        later(),
    );
    d.add(&write(&d, 34, Sent::Plain, false), None, later());
    let mut unnamed = write(&d, 35, Sent::IfNoneMatch, true);
    unnamed.name = None;
    d.add(&unnamed, None, later());
    let p = probes.try_recv().unwrap();
    assert_eq!((&*p.object, p.sent), ("b/k", Sent::IfMatch("e0".into())));
    assert!(
        probes.try_recv().is_err(),
        "only the orderable one with a name"
    );
}

#[tokio::test]
async fn object_doubts_hold_writes_as_the_hold_would() {
    let (_dir, d) = doubts();
    let until = later();
    let mut w = write(&d, 1, Sent::IfNoneMatch, false);
    w.token = None;
    w.alone = true;
    d.add(&w, None, until);
    // A conditional write in doubt at a store that ignores conditions:
    // every write to the object waits.
    assert_eq!(d.holds("b/k", false, false), Some(until));
    assert_eq!(d.holds("b/k", true, true), Some(until));
    assert_eq!(d.holds("b/other", true, false), None);
    let (_dir2, d) = doubts();
    let mut w = write(&d, 1, Sent::Plain, false);
    w.token = None;
    d.add(&w, None, until);
    // An unconditional one: only conditional writes the store does not
    // judge wait.
    assert_eq!(d.holds("b/k", false, false), None);
    assert_eq!(d.holds("b/k", true, true), None);
    assert_eq!(d.holds("b/k", true, false), Some(until));
}

#[tokio::test(start_paused = true)]
async fn doubts_end_with_their_time_and_let_their_records_go() {
    let dir = tempfile::tempdir().unwrap();
    let landing = Landing::open(dir.path(), false).unwrap().landing;
    let d = Arc::new(Doubts::new(Some(landing.clone())));
    d.sweep();
    let w = write(&d, 33, Sent::Plain, false);
    let record = landing.record(&w).unwrap();
    d.add(
        &w,
        Some(Arc::new(record)),
        Instant::now() + Duration::from_secs(2),
    );
    d.blanket(Instant::now() + Duration::from_secs(1));
    assert_eq!(landing.taken(), 1);
    assert!(matches!(
        d.admits("b/j", 1, Touch::Read),
        Verdict::WaitUntil { .. }
    ));
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(d.admits("b/j", 1, Touch::Read), admit(&[]));
    assert!(d.any());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(landing.taken(), 0);
    assert!(!d.any());
}
