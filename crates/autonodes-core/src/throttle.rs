//! When a request an API server turned away for load is sent again. API Priority and
//! Fairness (Kubernetes 1.20 and later) and the max-in-flight limit answer `429 Too Many
//! Requests` with a `Retry-After` of seconds before the request runs, so sending it again
//! is safe for every verb. The wait is the server's, bounded: a tenant's API server must
//! not park the controller's requests for long ([`MAX_WAIT`]), and a request is sent at
//! most [`MAX_RETRIES`] more times; then the 429 is the request's answer, as before.

use std::time::Duration;

/// The status of a request turned away for load.
pub const TOO_MANY_REQUESTS: u16 = 429;
/// How many times a turned-away request is sent again.
pub const MAX_RETRIES: u32 = 3;
/// The longest wait before sending it again, whatever the server asks.
pub const MAX_WAIT: Duration = Duration::from_secs(10);
/// The first wait when the server names none (or not as seconds); it doubles per attempt.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(1);

/// How long to wait before sending again a request answered with `status` and the
/// `Retry-After` header `retry_after`, after `attempt` earlier retries; `None`: the answer
/// stands (not a 429, or retried [`MAX_RETRIES`] times).
pub fn retry_delay(status: u16, retry_after: Option<&str>, attempt: u32) -> Option<Duration> {
    if status != TOO_MANY_REQUESTS || attempt >= MAX_RETRIES {
        return None;
    }
    let asked = retry_after
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let backoff = DEFAULT_WAIT.saturating_mul(1u32 << attempt.min(8));
    Some(asked.unwrap_or(backoff).min(MAX_WAIT))
}

/// A token bucket: at most `capacity` takes at once, refilled at `per_second`. What the
/// metrics server's reviews of unknown bearer tokens go through, so that a flood of
/// distinct bad tokens costs the management API server a bounded number of reviews a
/// second. Time is given (`now`), never read.
#[derive(Clone, Copy, Debug)]
pub struct Bucket {
    capacity: f64,
    per_second: f64,
    tokens: f64,
    at: Option<std::time::Instant>,
}

impl Bucket {
    /// A full bucket of `capacity` refilled at `per_second`.
    pub fn new(capacity: u32, per_second: u32) -> Self {
        Bucket {
            capacity: f64::from(capacity),
            per_second: f64::from(per_second),
            tokens: f64::from(capacity),
            at: None,
        }
    }

    /// Takes one token at `now`, if one is left.
    pub fn take(&mut self, now: std::time::Instant) -> bool {
        if let Some(at) = self.at {
            let passed = now.saturating_duration_since(at).as_secs_f64();
            self.tokens = (self.tokens + passed * self.per_second).min(self.capacity);
        }
        self.at = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_gives_its_capacity_at_once_then_its_rate_and_never_more_than_its_capacity() {
        let start = std::time::Instant::now();
        let mut b = Bucket::new(10, 5);
        let at_once = (0..100).filter(|_| b.take(start)).count();
        assert_eq!(at_once, 10);
        let later = start + Duration::from_secs(2);
        assert_eq!((0..100).filter(|_| b.take(later)).count(), 10, "5 a second");
        let much_later = later + Duration::from_secs(3600);
        assert_eq!(
            (0..100).filter(|_| b.take(much_later)).count(),
            10,
            "refilled to its capacity, no more"
        );
        // A clock that goes back gives nothing.
        assert!(!b.take(start));
    }

    #[test]
    fn a_429_waits_the_seconds_the_server_asks_for_up_to_the_bound() {
        assert_eq!(retry_delay(429, Some("1"), 0), Some(Duration::from_secs(1)));
        assert_eq!(
            retry_delay(429, Some(" 3 "), 2),
            Some(Duration::from_secs(3))
        );
        assert_eq!(retry_delay(429, Some("0"), 0), Some(Duration::ZERO));
        assert_eq!(retry_delay(429, Some("86400"), 0), Some(MAX_WAIT));
    }

    #[test]
    fn a_429_without_seconds_backs_off_doubling_and_bounded() {
        for header in [
            None,
            Some("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some("-1"),
            Some(""),
        ] {
            assert_eq!(retry_delay(429, header, 0), Some(Duration::from_secs(1)));
            assert_eq!(retry_delay(429, header, 1), Some(Duration::from_secs(2)));
            assert_eq!(retry_delay(429, header, 2), Some(Duration::from_secs(4)));
        }
    }

    #[test]
    fn other_answers_and_a_fourth_429_stand() {
        for status in [200, 400, 409, 500, 503, 504] {
            assert_eq!(retry_delay(status, Some("1"), 0), None, "{status}");
        }
        assert_eq!(retry_delay(429, Some("1"), MAX_RETRIES), None);
    }
}
