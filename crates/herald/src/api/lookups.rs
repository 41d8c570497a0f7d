//! What the API looks up on every request (a token's digest, the
//! application a message's uid names), kept in memory so that a request
//! does not cost a database read. Entries live [`Lookups::TTL`], which
//! bounds how long a process that missed a change keeps one; the map is
//! simply emptied when it reaches its bound.
//!
//! A removal (clear or forget) counts: a lookup read from the store before
//! a removal is not kept after it, since it may be of what was removed (a
//! token revoked, a uid moved to another application while the read was
//! under way).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::RwLock;
use std::time::{Duration, Instant};

pub struct Lookups<K, V> {
    kept: RwLock<Kept<K, V>>,
    max_entries: usize,
}

struct Kept<K, V> {
    entries: HashMap<K, (V, Instant)>,
    removals: u64,
}

/// A lookup not kept: the removals so far, for [`Lookups::put`] once the
/// store was read.
#[derive(Debug, Clone, Copy)]
pub struct Miss(u64);

impl<K: Hash + Eq, V: Clone> Lookups<K, V> {
    pub const TTL: Duration = Duration::from_secs(30);

    pub fn new(max_entries: usize) -> Self {
        Lookups {
            kept: RwLock::new(Kept {
                entries: HashMap::new(),
                removals: 0,
            }),
            max_entries,
        }
    }

    // A poisoned lock only means a panic elsewhere while it was held; the
    // map is still a valid map (every write is one call).
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Kept<K, V>> {
        self.kept.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Kept<K, V>> {
        self.kept.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The kept lookup of `key`, or a [`Miss`] to read the store with.
    pub fn get<Q>(&self, key: &Q) -> Result<V, Miss>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let kept = self.read();
        kept.entries
            .get(key)
            .filter(|(_, at)| at.elapsed() < Self::TTL)
            .map(|(value, _)| value.clone())
            .ok_or(Miss(kept.removals))
    }

    /// A [`Miss`] for a store read not preceded by [`Lookups::get`].
    pub fn miss(&self) -> Miss {
        Miss(self.read().removals)
    }

    /// Keeps what the store said after `miss`, unless something was
    /// removed since.
    pub fn put(&self, key: K, value: V, miss: Miss) {
        let mut kept = self.write();
        if kept.removals != miss.0 {
            return;
        }
        if kept.entries.len() >= self.max_entries {
            kept.entries.clear();
        }
        kept.entries.insert(key, (value, Instant::now()));
    }

    pub fn clear(&self) {
        let mut kept = self.write();
        kept.entries.clear();
        kept.removals += 1;
    }

    /// Forgets every entry whose value `stale` says is.
    pub fn forget_where(&self, mut stale: impl FnMut(&V) -> bool) {
        let mut kept = self.write();
        kept.entries.retain(|_, (value, _)| !stale(value));
        kept.removals += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::Lookups;

    /// A token revoked while a request reads it from the store (the clear
    /// lands between the read and the keeping) is not kept as valid: it
    /// would have worked on for the cache's 30 s.
    #[test]
    fn a_lookup_read_before_a_clear_is_not_kept_after_it() {
        let lookups: Lookups<[u8; 32], Option<u8>> = Lookups::new(10);
        let digest = [7u8; 32];
        let Err(miss) = lookups.get(&digest) else {
            panic!("an empty cache has nothing")
        };
        lookups.clear();
        lookups.put(digest, None, miss);
        let Err(miss) = lookups.get(&digest) else {
            panic!("read before the clear: not kept")
        };
        lookups.put(digest, None, miss);
        assert!(
            matches!(lookups.get(&digest), Ok(None)),
            "read after it: kept"
        );
    }

    /// Likewise a uid read as naming an application that is forgotten
    /// meanwhile (deleted, or the uid moved).
    #[test]
    fn a_lookup_read_before_a_forget_is_not_kept_after_it() {
        let lookups: Lookups<String, u32> = Lookups::new(10);
        let miss = lookups.miss();
        lookups.forget_where(|app| *app == 1);
        lookups.put("uid".to_owned(), 1, miss);
        assert!(lookups.get("uid").is_err());
        lookups.put("uid".to_owned(), 2, lookups.miss());
        assert_eq!(lookups.get("uid").ok(), Some(2));
    }

    #[test]
    fn the_map_is_emptied_at_its_bound() {
        let lookups: Lookups<u32, u32> = Lookups::new(2);
        for key in 0..3 {
            lookups.put(key, key, lookups.miss());
        }
        assert!(lookups.get(&0).is_err() && lookups.get(&1).is_err());
        assert_eq!(lookups.get(&2).ok(), Some(2));
    }
}
