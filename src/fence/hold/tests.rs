//! The unit tests of `fence::hold`.

use super::*;

fn holds() -> Arc<Holds> {
    Arc::new(Holds::new(Duration::from_secs(5), None))
}

fn one(name: &str, mode: Mode) -> Vec<(String, Mode)> {
    vec![(name.to_string(), mode)]
}

#[tokio::test(start_paused = true)]
async fn shared_holds_go_together_and_alone_waits_for_them() {
    let h = holds();
    let a = h.try_share("b", "k", Holder::AnyReplica).unwrap();
    let b = h
        .hold(one("b/k", Mode::Shared), Holder::AnyReplica)
        .await
        .unwrap();
    let h2 = h.clone();
    let alone =
        tokio::spawn(async move { h2.hold(one("b/k", Mode::Alone), Holder::AnyReplica).await });
    tokio::task::yield_now().await;
    assert!(!alone.is_finished());
    drop(a);
    tokio::task::yield_now().await;
    assert!(!alone.is_finished());
    drop(b);
    let alone = alone.await.unwrap().unwrap();
    assert!(
        h.try_share("b", "k", Holder::AnyReplica).is_none(),
        "a shared write waits for an alone one"
    );
    // Another object's conditional write goes beside it.
    drop(
        h.hold(one("b/other", Mode::Alone), Holder::AnyReplica)
            .await
            .unwrap(),
    );
    drop(alone);
    assert!(h.try_share("b", "k", Holder::AnyReplica).is_some());
    assert_eq!(h.entries(), 0, "nothing held alone, nothing kept");
}

#[tokio::test(start_paused = true)]
async fn a_shared_write_waits_for_a_conditional_one_and_gives_up_at_the_bound() {
    let h = holds();
    let alone = h
        .hold(one("b/k", Mode::Alone), Holder::AnyReplica)
        .await
        .unwrap();
    let waited = Instant::now();
    assert!(matches!(
        h.hold(one("b/k", Mode::Shared), Holder::AnyReplica).await,
        Err(HoldError::Busy(_))
    ));
    assert_eq!(waited.elapsed(), Duration::from_secs(5));
    drop(alone);
    assert!(
        h.hold(one("b/k", Mode::Shared), Holder::AnyReplica)
            .await
            .is_ok()
    );
    assert_eq!(h.entries(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_conditional_write_is_not_overtaken() {
    // A shared write that comes after a waiting conditional one does not
    // overtake it (else a stream of unconditional writes could starve it).
    let h = holds();
    let first = h.try_share("b", "k", Holder::AnyReplica).unwrap();
    let h2 = h.clone();
    let alone =
        tokio::spawn(async move { h2.hold(one("b/k", Mode::Alone), Holder::AnyReplica).await });
    tokio::task::yield_now().await;
    assert!(
        h.try_share("b", "k", Holder::AnyReplica).is_none(),
        "a later shared write overtook a waiting alone"
    );
    let h3 = h.clone();
    let late =
        tokio::spawn(async move { h3.hold(one("b/k", Mode::Shared), Holder::AnyReplica).await });
    tokio::task::yield_now().await;
    drop(first);
    let alone = alone.await.unwrap().unwrap();
    tokio::task::yield_now().await;
    assert!(!late.is_finished());
    drop(alone);
    assert!(late.await.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn conditional_writes_of_one_object_take_turns() {
    let h = holds();
    let first = h
        .hold(one("b/k", Mode::Alone), Holder::AnyReplica)
        .await
        .unwrap();
    let h2 = h.clone();
    let second =
        tokio::spawn(async move { h2.hold(one("b/k", Mode::Alone), Holder::AnyReplica).await });
    tokio::task::yield_now().await;
    assert!(!second.is_finished());
    drop(first);
    drop(second.await.unwrap().unwrap());
    assert_eq!(h.entries(), 0);
}

#[tokio::test(start_paused = true)]
async fn several_objects_are_held_without_deadlock() {
    // Requests naming the same objects in other orders and modes (what
    // DeleteObjects sends), among unconditional writes of each object.
    let h = holds();
    let mut tasks = Vec::new();
    for i in 0..16 {
        let many = h.clone();
        tasks.push(tokio::spawn(async move {
            let mut names: Vec<(String, Mode)> = (0..6)
                .map(|o| {
                    let mode = if (i + o) % 3 == 0 {
                        Mode::Alone
                    } else {
                        Mode::Shared
                    };
                    (format!("b/{o}"), mode)
                })
                .collect();
            names.rotate_left(i % 6);
            names.push(names[0].clone());
            let held = many.hold(names, Holder::AnyReplica).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(held);
        }));
        let single = h.clone();
        tasks.push(tokio::spawn(async move {
            let held = single
                .hold(
                    one(&format!("b/{}", i % 6), Mode::Shared),
                    Holder::AnyReplica,
                )
                .await;
            tokio::time::sleep(Duration::from_millis(5)).await;
            drop(held.unwrap());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(h.entries(), 0);
    for s in h.table.stripes.iter() {
        assert_eq!((s.shared.load(SeqCst), s.alone.load(SeqCst)), (0, 0));
    }
}
