//! The one webhook receiver every bench run uses, on 127.0.0.1 in this
//! process. It answers each path by its rule (a delay, or 500), and
//! records two ways:
//!
//! - `/fast/{index}`, the headline runs' endpoints: the first arrival of
//!   each message `seq` (read from the payload's `{"seq":N,…}`), lock-free,
//!   counted against `expect`;
//! - every other path: each arrival's time, per path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use tokio::sync::Notify;

pub struct Receiver {
    epoch: Instant,
    /// First arrival (ns since `epoch`, 0: none yet) per (endpoint, seq).
    firsts: Vec<Vec<AtomicU64>>,
    received: AtomicUsize,
    expected: AtomicUsize,
    /// Signalled when `received` reaches `expected`.
    done: Notify,
    /// Arrival times per path (other than `/fast/…`).
    times: Mutex<HashMap<String, Vec<Instant>>>,
    /// Per path prefix: how long to wait before answering, and whether to
    /// answer 500 (a failed request is not recorded as an arrival).
    rules: Mutex<Vec<(String, Duration, bool)>>,
    arrived: Notify,
}

impl Receiver {
    /// Starts a receiver with room for `messages` first arrivals at each of
    /// `endpoints` `/fast/{index}` paths, timed from `epoch`; returns it and
    /// its base URL (`http://127.0.0.1:port`).
    pub async fn start(
        endpoints: usize,
        messages: usize,
        epoch: Instant,
    ) -> anyhow::Result<(Arc<Receiver>, String)> {
        let rx = Arc::new(Receiver {
            epoch,
            firsts: (0..endpoints)
                .map(|_| (0..messages).map(|_| AtomicU64::new(0)).collect())
                .collect(),
            received: AtomicUsize::new(0),
            expected: AtomicUsize::new(usize::MAX),
            done: Notify::new(),
            times: Mutex::default(),
            rules: Mutex::default(),
            arrived: Notify::new(),
        });
        let app = axum::Router::new().fallback(answer).with_state(rx.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok((rx, format!("http://{addr}")))
    }

    /// Paths starting with `prefix` answer after `delay`, with 500 if `fail`.
    pub fn rule(&self, prefix: &str, delay: Duration, fail: bool) {
        let mut rules = self.rules.lock().unwrap_or_else(|p| p.into_inner());
        rules.retain(|(p, _, _)| p != prefix);
        rules.push((prefix.to_owned(), delay, fail));
    }

    /// First arrivals at `/fast/…` to wait for in [`Receiver::all_arrived`].
    pub fn expect(&self, n: usize) {
        self.expected.store(n, Ordering::SeqCst);
    }

    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }

    /// Waits until `expect`'s count of first arrivals is in.
    pub async fn all_arrived(&self) {
        while self.received() < self.expected.load(Ordering::SeqCst) {
            let notified = self.done.notified();
            if self.received() >= self.expected.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }

    /// The first arrivals per `/fast/{index}` endpoint, ns since the epoch
    /// (0: never arrived).
    pub fn firsts(&self) -> impl Iterator<Item = Vec<u64>> + '_ {
        self.firsts
            .iter()
            .map(|per| per.iter().map(|a| a.load(Ordering::SeqCst)).collect())
    }

    pub fn count(&self, path: &str) -> usize {
        self.times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(path)
            .map_or(0, Vec::len)
    }

    pub fn times(&self, path: &str) -> Vec<Instant> {
        self.times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(path)
            .cloned()
            .unwrap_or_default()
    }

    /// Waits (bounded by `within`) until `n` requests to `path` arrived.
    pub async fn wait_for(&self, path: &str, n: usize, within: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let notified = self.arrived.notified();
            if self.count(path) >= n {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() && self.count(path) < n {
                bail!(
                    "{path}: {} of {n} arrived within {within:?}",
                    self.count(path)
                );
            }
        }
    }

    /// Records a first arrival of `/fast/{index}`'s message in `body`.
    fn first_arrival(&self, index: &str, body: &[u8]) {
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // The payload starts with {"seq":N,…}: read N without a full parse.
        let seq = std::str::from_utf8(body)
            .ok()
            .and_then(|s| s.strip_prefix("{\"seq\":"))
            .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<usize>().ok());
        let slot = index
            .parse::<usize>()
            .ok()
            .and_then(|i| self.firsts.get(i))
            .zip(seq)
            .and_then(|(per, s)| per.get(s));
        // Count first arrivals only; retries or duplicates do not inflate.
        if let Some(slot) = slot {
            if slot
                .compare_exchange(0, now.max(1), Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                let n = self.received.fetch_add(1, Ordering::SeqCst) + 1;
                if n >= self.expected.load(Ordering::SeqCst) {
                    self.done.notify_one();
                }
            }
        }
    }
}

async fn answer(State(rx): State<Arc<Receiver>>, uri: Uri, body: bytes::Bytes) -> StatusCode {
    let path = uri.path();
    if let Some(index) = path.strip_prefix("/fast/") {
        rx.first_arrival(index, &body);
        return StatusCode::OK;
    }
    let (delay, fail) = {
        let rules = rx.rules.lock().unwrap_or_else(|p| p.into_inner());
        rules
            .iter()
            .find(|(p, _, _)| path.starts_with(p.as_str()))
            .map_or((Duration::ZERO, false), |(_, d, f)| (*d, *f))
    };
    if !fail {
        rx.times
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(path.to_owned())
            .or_default()
            .push(Instant::now());
        rx.arrived.notify_waiters();
    }
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if fail {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    }
}
