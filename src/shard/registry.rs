//! A worker's subscription table: (project, channel) → the local connections subscribed.
//!
//! Two levels (project index, then channel name) so a lookup by `&str` needs no
//! allocation. Each channel's subscribers are a [`Subscribers`]: a dense vector for the
//! fan-out, O(1) unsubscribe (see its module). Empty
//! channels and projects are removed so the table only holds what is subscribed.
//! Channel matching is exact byte equality: `news`, `News` and `news ` differ.
//!
//! Every change reports its transition (first subscriber of a channel on this core,
//! last one gone, nothing changed), so that the one caller that mirrors the table into
//! the interest filter and the cluster bridge (`Shard`) never has to work it out again.

use std::collections::HashMap;
use std::rc::Rc;

use crate::ws::conn::WsConn;

pub(crate) use super::subscribers::Subscribers;

/// What a subscribe changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subscribed {
    /// The channel had no subscriber on this core before.
    First,
    /// Added beside other local subscribers.
    Added,
    /// The connection was already subscribed; nothing changed.
    Already,
}

/// What an unsubscribe changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsubscribed {
    /// The channel has no subscriber left on this core.
    Last,
    /// Removed; others remain.
    Removed,
    /// The connection was not subscribed; nothing changed.
    NotSubscribed,
}

#[derive(Default)]
pub struct Registry {
    projects: HashMap<u32, HashMap<Box<str>, Subscribers>>,
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Add `conn` to a channel.
    pub fn subscribe(&mut self, project: u32, channel: &str, conn: &Rc<WsConn>) -> Subscribed {
        let channels = self.projects.entry(project).or_default();
        if let Some(subs) = channels.get_mut(channel) {
            return match subs.insert(conn) {
                true => Subscribed::Added,
                false => Subscribed::Already,
            };
        }
        let mut subs = Subscribers::default();
        subs.insert(conn);
        channels.insert(channel.into(), subs);
        Subscribed::First
    }

    /// Remove a connection from a channel.
    pub fn unsubscribe(&mut self, project: u32, channel: &str, conn_id: u64) -> Unsubscribed {
        let Some(channels) = self.projects.get_mut(&project) else {
            return Unsubscribed::NotSubscribed;
        };
        let Some(subs) = channels.get_mut(channel) else {
            return Unsubscribed::NotSubscribed;
        };
        if !subs.remove(conn_id) {
            return Unsubscribed::NotSubscribed;
        }
        if !subs.is_empty() {
            return Unsubscribed::Removed;
        }
        channels.remove(channel);
        if channels.is_empty() {
            self.projects.remove(&project);
        }
        Unsubscribed::Last
    }

    pub fn subscribers(&self, project: u32, channel: &str) -> Option<&Subscribers> {
        self.projects.get(&project)?.get(channel)
    }

    /// Number of (project, channel) pairs with at least one subscriber.
    #[cfg(any(test, feature = "bench"))]
    pub fn channel_count(&self) -> usize {
        self.projects.values().map(HashMap::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(id: u64) -> Rc<WsConn> {
        Rc::new(WsConn::new(id, -1, 1 << 20, 0))
    }

    #[test]
    fn transitions_are_reported() {
        let mut r = Registry::new();
        let (a, b) = (conn(1), conn(2));
        assert_eq!(r.subscribe(7, "news", &a), Subscribed::First);
        assert_eq!(r.subscribe(7, "news", &a), Subscribed::Already);
        assert_eq!(r.subscribe(7, "news", &b), Subscribed::Added);
        // Another project's channel of the same name is another channel.
        assert_eq!(r.subscribe(8, "news", &b), Subscribed::First);
        assert_eq!(r.channel_count(), 2);
        assert_eq!(r.unsubscribe(7, "news", 1), Unsubscribed::Removed);
        assert_eq!(r.unsubscribe(7, "news", 1), Unsubscribed::NotSubscribed);
        assert_eq!(r.unsubscribe(7, "news", 2), Unsubscribed::Last);
        assert_eq!(r.unsubscribe(7, "other", 2), Unsubscribed::NotSubscribed);
        assert!(r.subscribers(7, "news").is_none());
        assert_eq!(r.channel_count(), 1);
    }
}
