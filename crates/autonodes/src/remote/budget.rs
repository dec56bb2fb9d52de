//! The memory budget of tenant answers: how many bytes of tenant API servers' answers this
//! process holds while it reads them, across every tenant cluster at once. A tenant chooses
//! how many clusters it names and how large its servers answer; the per-cluster bounds
//! (`TENANT_BODY_LIMIT` and `BODIES_AT_ONCE` of the guarded clients) do not bound
//! their sum, this does.
//!
//! Every frame of a tenant's answer is charged, in KiB, to its namespace's share and to
//! the process-wide total before it is handed on: a list's bytes until the whole answer is
//! read (then it is decoded and dropped), a watch's bytes until the line they belong to
//! is complete (each line is one event, decoded at once). A frame that finds no room waits
//! up to [`BUDGET_WAIT`] for it and then fails its answer with [`OverBudget`], which a
//! claim or pool shows in its condition; what the failed answer held is given back at
//! once. Unread, a waiting answer stays in the socket, so the server cannot push more.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::BoxError;

/// How long a frame waits for room in the budget before its answer fails.
pub(crate) const BUDGET_WAIT: Duration = Duration::from_secs(5);

/// The default budget of all tenants' answers together (`--tenant-answer-budget`): 64 MiB.
pub(crate) const DEFAULT_TOTAL: u64 = 64 << 20;
/// The default share of one tenant namespace (`--tenant-answer-budget-per-namespace`):
/// 16 MiB, two of the largest answers a tenant's server may give.
pub(crate) const DEFAULT_PER_NAMESPACE: u64 = 16 << 20;

/// The sizes of the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BudgetSize {
    /// Bytes of all tenants' answers held at once.
    pub total: u64,
    /// Bytes of the answers of one namespace's tenant clusters held at once.
    pub per_namespace: u64,
}

impl Default for BudgetSize {
    fn default() -> Self {
        BudgetSize {
            total: DEFAULT_TOTAL,
            per_namespace: DEFAULT_PER_NAMESPACE,
        }
    }
}

/// KiB needed for `bytes` (rounded up; a frame of one byte costs one KiB).
fn kib(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

/// The process-wide budget and the shares of the namespaces that read at the moment.
pub(crate) struct AnswerBudget {
    size: BudgetSize,
    total: Arc<Semaphore>,
    namespaces: Mutex<std::collections::HashMap<String, Weak<Semaphore>>>,
}

impl std::fmt::Debug for AnswerBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerBudget")
            .field("size", &self.size)
            .finish()
    }
}

impl AnswerBudget {
    /// A budget of `size` (each part at least 1 KiB).
    pub(crate) fn new(size: BudgetSize) -> Self {
        AnswerBudget {
            size,
            total: Arc::new(Semaphore::new(kib(size.total).max(1) as usize)),
            namespaces: Mutex::new(Default::default()),
        }
    }

    /// The share the clients of `namespace`'s tenant clusters charge: the namespace's
    /// semaphore is shared by all of them while any is alive.
    pub(crate) fn share(self: &Arc<Self>, namespace: &str) -> Arc<Share> {
        let mut map = self
            .namespaces
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.retain(|_, w| w.strong_count() > 0);
        let namespace_semaphore = match map.get(namespace).and_then(Weak::upgrade) {
            Some(s) => s,
            None => {
                let s = Arc::new(Semaphore::new(kib(self.size.per_namespace).max(1) as usize));
                map.insert(namespace.to_string(), Arc::downgrade(&s));
                s
            }
        };
        Arc::new(Share {
            namespace: namespace.to_string(),
            size: self.size,
            total: self.total.clone(),
            own: namespace_semaphore,
        })
    }

    /// Bytes of tenant answers held now (in KiB steps).
    #[cfg(test)]
    fn held_bytes(&self) -> u64 {
        let free = self.total.available_permits() as u64;
        (u64::from(kib(self.size.total).max(1)) - free.min(u64::from(kib(self.size.total)))) * 1024
    }
}

/// One namespace's share of the budget, charged by its tenant clusters' answers.
pub(crate) struct Share {
    namespace: String,
    size: BudgetSize,
    total: Arc<Semaphore>,
    own: Arc<Semaphore>,
}

/// An answer that found no room in the budget within [`BUDGET_WAIT`].
#[derive(Debug, thiserror::Error)]
#[error("the answers of tenant clusters being read at once passed autonodes' memory budget ({which}); the answer was dropped and is read again later")]
pub(crate) struct OverBudget {
    /// Which part: the namespace's share or the whole budget, with its size.
    pub which: String,
}

/// What an answer holds of the budget.
struct Held {
    own: OwnedSemaphorePermit,
    total: OwnedSemaphorePermit,
}

impl Held {
    fn kib(&self) -> u32 {
        u32::try_from(self.own.num_permits()).unwrap_or(u32::MAX)
    }

    fn merge(&mut self, other: Held) {
        self.own.merge(other.own);
        self.total.merge(other.total);
    }

    /// Gives back all but `keep` KiB.
    fn keep(&mut self, keep: u32) {
        let give = self.kib().saturating_sub(keep) as usize;
        if give > 0 {
            drop(self.own.split(give));
            drop(self.total.split(give));
        }
    }
}

impl Share {
    /// Takes `kib` KiB of the namespace's share and of the total, waiting up to
    /// [`BUDGET_WAIT`] for both.
    async fn charge(
        own: Arc<Semaphore>,
        total: Arc<Semaphore>,
        kib: u32,
        which: OverBudgetText,
    ) -> Result<Held, OverBudget> {
        let take = async {
            let own = own
                .clone()
                .acquire_many_owned(kib)
                .await
                .map_err(|_| which.namespace())?;
            let total = total
                .acquire_many_owned(kib)
                .await
                .map_err(|_| which.total())?;
            Ok(Held { own, total })
        };
        match tokio::time::timeout(BUDGET_WAIT, take).await {
            Ok(held) => held,
            Err(_) => Err(if own.available_permits() < kib as usize {
                which.namespace()
            } else {
                which.total()
            }),
        }
    }

    fn text(&self) -> OverBudgetText {
        OverBudgetText {
            namespace: self.namespace.clone(),
            size: self.size,
        }
    }

    /// `body` with each of its frames charged to this share: until the whole answer is
    /// read, or, for a watch (`lines`), until the line the bytes belong to is complete.
    pub(crate) fn charged<B>(self: &Arc<Self>, body: B, lines: bool) -> Charged<B> {
        Charged {
            body,
            share: self.clone(),
            lines,
            held: None,
            waiting: None,
        }
    }
}

/// What [`OverBudget`] says: the namespace and the sizes.
#[derive(Clone)]
struct OverBudgetText {
    namespace: String,
    size: BudgetSize,
}

impl OverBudgetText {
    fn namespace(&self) -> OverBudget {
        OverBudget {
            which: format!(
                "namespace {}'s share of {} MiB",
                self.namespace,
                self.size.per_namespace >> 20
            ),
        }
    }

    fn total(&self) -> OverBudget {
        OverBudget {
            which: format!("all tenants' {} MiB", self.size.total >> 20),
        }
    }
}

type Charging = Pin<Box<dyn Future<Output = Result<Held, OverBudget>> + Send>>;

/// A body whose frames are charged to a [`Share`] before they are handed on.
pub(crate) struct Charged<B> {
    body: B,
    share: Arc<Share>,
    lines: bool,
    held: Option<Held>,
    /// A data frame read but not yet handed on, and the charge it waits for.
    waiting: Option<(http_body::Frame<Bytes>, Charging)>,
}

impl<B> Charged<B> {
    /// Takes in what a frame was charged; for a watch, gives back what belongs to lines
    /// the frame completed.
    fn took(&mut self, charge: Held, data: &Bytes) {
        match self.held.as_mut() {
            Some(h) => h.merge(charge),
            None => self.held = Some(charge),
        }
        if !self.lines {
            return;
        }
        if let Some(last) = data.iter().rposition(|b| *b == b'\n') {
            // What follows the last newline starts the next line: only that stays held.
            let tail = (data.len() - last - 1) as u64;
            if let Some(h) = self.held.as_mut() {
                h.keep(kib(tail));
            }
        }
    }
}

impl<B> http_body::Body for Charged<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some((_, charging)) = this.waiting.as_mut() {
                let result = ready!(charging.as_mut().poll(cx));
                let Some((frame, _)) = this.waiting.take() else {
                    continue;
                };
                return match result {
                    Ok(held) => {
                        if let Some(data) = frame.data_ref() {
                            let data = data.clone();
                            this.took(held, &data);
                        }
                        Poll::Ready(Some(Ok(frame)))
                    }
                    Err(over) => {
                        // What this answer held goes back at once.
                        this.held = None;
                        Poll::Ready(Some(Err(over.into())))
                    }
                };
            }
            let frame = match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    this.held = None;
                    return Poll::Ready(None);
                }
            };
            let Some(len) = frame.data_ref().map(|d| d.len() as u64) else {
                return Poll::Ready(Some(Ok(frame)));
            };
            let need = kib(len);
            let share = &this.share;
            // Room now: no future, no wait.
            if let Ok(own) = share.own.clone().try_acquire_many_owned(need) {
                if let Ok(total) = share.total.clone().try_acquire_many_owned(need) {
                    if let Some(data) = frame.data_ref() {
                        let data = data.clone();
                        this.took(Held { own, total }, &data);
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
            }
            let charging = Box::pin(Share::charge(
                share.own.clone(),
                share.total.clone(),
                need,
                share.text(),
            ));
            this.waiting = Some((frame, charging));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.waiting.is_none() && self.body.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// The frames of a test body.
    type Frames =
        futures::stream::Iter<std::vec::IntoIter<Result<http_body::Frame<Bytes>, BoxError>>>;

    /// A body of `frames`, one after the other.
    fn body(frames: Vec<&'static [u8]>) -> http_body_util::StreamBody<Frames> {
        let frames: Vec<Result<http_body::Frame<Bytes>, BoxError>> = frames
            .into_iter()
            .map(|f| Ok(http_body::Frame::data(Bytes::from_static(f))))
            .collect();
        http_body_util::StreamBody::new(futures::stream::iter(frames))
    }

    fn budget(total_kib: u64, per_namespace_kib: u64) -> Arc<AnswerBudget> {
        Arc::new(AnswerBudget::new(BudgetSize {
            total: total_kib << 10,
            per_namespace: per_namespace_kib << 10,
        }))
    }

    #[tokio::test]
    async fn a_list_holds_its_bytes_until_it_is_read_and_gives_them_back_at_its_end() {
        let b = budget(64, 16);
        let share = b.share("team-a");
        let mut answer = share.charged(body(vec![&[b'x'; 3000], &[b'y'; 2000]]), false);
        answer.frame().await.expect("first").expect("ok");
        assert_eq!(b.held_bytes(), 3 << 10);
        answer.frame().await.expect("second").expect("ok");
        assert_eq!(b.held_bytes(), 5 << 10);
        assert!(answer.frame().await.is_none());
        assert_eq!(b.held_bytes(), 0);
    }

    #[tokio::test]
    async fn a_watch_holds_only_the_line_it_is_reading() {
        let b = budget(64, 16);
        let share = b.share("team-a");
        let mut first = [b'x'; 4000];
        first[2999] = b'\n';
        let mut watch = share.charged(body(vec![&[b'a'; 5000], &[b'b'; 10]]), true);
        watch.frame().await.expect("a").expect("ok");
        assert_eq!(b.held_bytes(), 5 << 10, "an incomplete line is held");
        drop(watch);
        assert_eq!(b.held_bytes(), 0, "a dropped answer gives everything back");
        let first: &'static [u8] = Box::leak(Box::new(first));
        let mut watch = share.charged(body(vec![&[b'a'; 5000], first]), true);
        watch.frame().await.expect("a").expect("ok");
        watch.frame().await.expect("line end").expect("ok");
        assert_eq!(
            b.held_bytes(),
            1 << 10,
            "after its line ends, only the next line's 1,000 bytes are held"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_past_its_namespace_s_share_fails_while_another_namespace_is_served() {
        let b = budget(64, 16);
        let hostile = b.share("hostile");
        // Holds its whole share, unread to the end.
        let mut big = hostile.charged(body(vec![&[b'h'; 16 << 10], &[b'h'; 1]]), false);
        big.frame().await.expect("frame").expect("ok");
        let mut more = hostile.charged(body(vec![&[b'h'; 1024]]), false);
        let err = more
            .frame()
            .await
            .expect("frame")
            .expect_err("over its share");
        assert!(err.is::<OverBudget>(), "{err}");
        assert!(
            err.to_string().contains("namespace hostile's share"),
            "{err}"
        );
        assert_eq!(
            b.held_bytes(),
            16 << 10,
            "the failed answer gave back what it held"
        );
        let other = b.share("team-b");
        let mut small = other.charged(body(vec![&[b'o'; 2048]]), false);
        small.frame().await.expect("frame").expect("served");
    }

    #[tokio::test(start_paused = true)]
    async fn the_whole_budget_bounds_many_namespaces_and_a_waiting_answer_goes_on_once_room_is_back(
    ) {
        let b = budget(24, 16);
        let one = b.share("one");
        let two = b.share("two");
        let mut first = one.charged(body(vec![&[b'1'; 16 << 10], &[b'1'; 1]]), false);
        first.frame().await.expect("frame").expect("ok");
        let mut second = two.charged(body(vec![&[b'2'; 12 << 10]]), false);
        let err = second
            .frame()
            .await
            .expect("frame")
            .expect_err("over the total");
        assert!(err.to_string().contains("all tenants'"), "{err}");
        // Room that comes back within the wait lets the answer go on.
        let mut third = two.charged(body(vec![&[b'3'; 12 << 10]]), false);
        let waiting = tokio::spawn(async move { third.frame().await.map(|f| f.is_ok()) });
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(first);
        assert_eq!(waiting.await.expect("task"), Some(true));
    }
}
