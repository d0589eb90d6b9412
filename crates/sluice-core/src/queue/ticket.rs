//! A waiter's claim ([`Ticket`]) and how urgent it is ([`Priority`]). A ticket's id carries its
//! priority in its two low bits, so a ticket alone names its waiter's level.
//!
//! Plain values: nothing here reads or changes a queue.

/// How urgent a waiting request is. Higher priorities are served first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Priority {
    /// Served before everything else.
    High = 0,
    /// The default.
    #[default]
    Normal = 1,
    /// Served only when no higher priority waits.
    Low = 2,
}

impl Priority {
    pub(super) const COUNT: usize = 3;

    pub(super) const fn index(self) -> usize {
        self as usize
    }

    pub(super) fn from_index(i: u64) -> Priority {
        match i {
            0 => Priority::High,
            1 => Priority::Normal,
            _ => Priority::Low,
        }
    }
}

/// A waiting request's claim, handed back to [`WaitQueue::cancel`] and named in outcomes.
///
/// [`WaitQueue::cancel`]: super::WaitQueue::cancel
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket {
    pub(super) id: u64,
    pub(super) flow: u64,
}

impl Ticket {
    /// A number unique among this queue's tickets.
    pub const fn id(&self) -> u64 {
        self.id
    }

    /// The flow the request was offered in.
    pub const fn flow(&self) -> u64 {
        self.flow
    }

    /// The priority the request was offered at.
    pub fn priority(&self) -> Priority {
        Priority::from_index(self.id & 3)
    }
}
