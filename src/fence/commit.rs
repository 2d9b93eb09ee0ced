//! The commit gate: where a fenced write's permit meets its body. The last
//! item of the body is held back until the body has ended cleanly and the
//! permit still stands, so a backend never holds a complete body that the
//! fence has aborted. It knows nothing of S3: the item and error types are
//! the caller's, and the caller says what error an abort ends the body with.

use super::gate::Permit;
use futures_util::{Stream, StreamExt};
use std::pin::Pin;
use std::sync::Arc;

/// A body on its way to the backend, item by item.
pub type Items<T, E> = Pin<Box<dyn Stream<Item = Result<T, E>> + Send>>;

/// Holds back the last item of `input` until the stream has ended cleanly
/// (so every check upstream of the gate has passed) and, for a fenced write,
/// until the permit confirms the write was not aborted. Until then the
/// backend cannot have a complete body. An abort while streaming ends the
/// body with `stale(permit)`, which aborts the upstream request.
pub fn commit_gate<T, E, F>(
    input: Items<T, E>,
    permit: Option<Arc<Permit>>,
    stale: F,
) -> Items<T, E>
where
    T: Send + 'static,
    E: Send + 'static,
    F: Fn(&Permit) -> E + Send + 'static,
{
    struct St<T, E, F> {
        input: Items<T, E>,
        held: Option<T>,
        permit: Option<Arc<Permit>>,
        stale: F,
        done: bool,
    }
    impl<T, E, F: Fn(&Permit) -> E> St<T, E, F> {
        fn stale(&self) -> E {
            let p = self.permit.as_ref().expect("only fenced writes abort");
            (self.stale)(p)
        }
    }
    let st = St {
        input,
        held: None,
        permit,
        stale,
        done: false,
    };
    Box::pin(futures_util::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            let next = match &st.permit {
                Some(p) => {
                    let signal = p.abort_signal();
                    tokio::select! {
                        biased;
                        _ = signal.fired() => {
                            st.done = true;
                            let e = st.stale();
                            return Some((Err(e), st));
                        }
                        item = st.input.next() => item,
                    }
                }
                None => st.input.next().await,
            };
            match next {
                Some(Ok(item)) => {
                    if let Some(prev) = st.held.replace(item) {
                        return Some((Ok(prev), st));
                    }
                }
                Some(Err(e)) => {
                    st.done = true;
                    return Some((Err(e), st));
                }
                None => {
                    st.done = true;
                    if let Some(p) = &st.permit
                        && !p.body_complete()
                    {
                        let e = st.stale();
                        return Some((Err(e), st));
                    }
                    return st.held.take().map(|item| (Ok(item), st));
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn gate_never_releases_last_frame_before_a_clean_end() {
        let parts: Vec<Result<&str, &str>> = vec![Ok("a"), Ok("b"), Err("incomplete body")];
        let out: Vec<_> = commit_gate(
            Box::pin(futures_util::stream::iter(parts)),
            None,
            |_| "stale",
        )
        .collect()
        .await;
        assert_eq!(out.len(), 2, "only the first frame and the error");
        assert!(out[1].is_err());
    }
}
