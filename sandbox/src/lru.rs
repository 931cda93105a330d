//! A small bounded least-recently-used map for check verdicts.
//!
//! Owns eviction by recency. Hand-written: a few dozen entries, looked up once per render, so a
//! linear scan over a `VecDeque` is simpler than a dependency and never the cost that matters
//! (a `haproxy -c` run is). It must never grow past its capacity.

use std::collections::VecDeque;

/// A map of at most `capacity` entries; inserting past it drops the least recently used one.
#[derive(Debug, Clone)]
pub struct Lru<K, V> {
    capacity: usize,
    /// Most recently used last.
    entries: VecDeque<(K, V)>,
}

impl<K: PartialEq, V: Clone> Lru<K, V> {
    /// An empty map holding at most `capacity` entries (at least one).
    pub fn new(capacity: usize) -> Self {
        Lru { capacity: capacity.max(1), entries: VecDeque::new() }
    }

    /// The value of `key`, which becomes the most recently used.
    pub fn get(&mut self, key: &K) -> Option<V> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        let e = self.entries.remove(i)?;
        let v = e.1.clone();
        self.entries.push_back(e);
        Some(v)
    }

    /// Sets `key` to `value`, the most recently used; evicts the least recently used when full.
    pub fn insert(&mut self, key: K, value: V) {
        if let Some(i) = self.entries.iter().position(|(k, _)| *k == key) {
            self.entries.remove(i);
        }
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back((key, value));
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_the_least_recently_used() {
        let mut l = Lru::new(2);
        l.insert(1, "a");
        l.insert(2, "b");
        assert_eq!(l.get(&1), Some("a"));
        l.insert(3, "c");
        assert_eq!(l.get(&2), None, "2 was the least recently used");
        assert_eq!((l.get(&1), l.get(&3), l.len()), (Some("a"), Some("c"), 2));
        l.insert(3, "d");
        assert_eq!((l.get(&3), l.len()), (Some("d"), 2));
    }
}
