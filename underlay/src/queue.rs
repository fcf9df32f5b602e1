//! One stack's bounded FIFO in front of the scheduler.

use std::collections::VecDeque;

use uniplane_dataplane::sched::Backlog;
use uniplane_dataplane::Message;

/// A FIFO of messages bounded in count (its slots are allocated up front)
/// and in bytes. Pushing into a full queue gives the message back.
#[derive(Debug, Clone)]
pub(crate) struct MessageQueue {
    messages: VecDeque<Message>,
    capacity: usize,
    bytes: u64,
    max_bytes: u64,
}

impl MessageQueue {
    pub(crate) fn new(capacity: usize, max_bytes: u64) -> Self {
        MessageQueue {
            messages: VecDeque::with_capacity(capacity),
            capacity,
            bytes: 0,
            max_bytes,
        }
    }

    /// Whether a message of `len` encoded bytes fits.
    #[inline]
    pub(crate) fn has_room(&self, len: u64) -> bool {
        // An empty queue takes any message, so a byte bound smaller than
        // one message cannot block a stack for ever.
        self.messages.len() < self.capacity
            && (self.messages.is_empty() || self.bytes + len <= self.max_bytes)
    }

    /// Appends `msg`, or gives it back when a bound would be exceeded.
    #[inline]
    pub(crate) fn push(&mut self, msg: Message) -> Result<(), Message> {
        let len = msg.encoded_len() as u64;
        if !self.has_room(len) {
            return Err(msg);
        }
        self.bytes += len;
        self.messages.push_back(msg);
        Ok(())
    }

    #[inline]
    pub(crate) fn pop(&mut self) -> Option<Message> {
        let msg = self.messages.pop_front()?;
        self.bytes -= msg.encoded_len() as u64;
        Some(msg)
    }

    #[inline]
    pub(crate) fn head_len(&self) -> Option<u32> {
        self.messages.front().map(|m| m.encoded_len() as u32)
    }

    pub(crate) fn len(&self) -> usize {
        self.messages.len()
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn free(&self) -> usize {
        self.capacity - self.messages.len()
    }
}

/// The queues of one interface as the scheduler sees them.
#[derive(Debug, Clone)]
pub(crate) struct Queues(pub(crate) Vec<MessageQueue>);

impl Backlog for Queues {
    #[inline]
    fn head_len(&self, queue: usize) -> Option<u32> {
        self.0.get(queue).and_then(MessageQueue::head_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn msg(len: usize) -> Message {
        let src = "1.1.1.1:1/1".parse().unwrap();
        let dst = "2.2.2.2:2/2".parse().unwrap();
        Message::send(src, dst, Bytes::from(vec![0; len])).unwrap()
    }

    #[test]
    fn a_queue_full_in_count_gives_the_message_back() {
        let mut q = MessageQueue::new(2, u64::MAX);
        for _ in 0..2 {
            q.push(msg(1)).unwrap();
        }
        let back = q.push(msg(5)).unwrap_err();
        assert_eq!(back.payload().len(), 5);
        assert_eq!((q.len(), q.bytes(), q.free()), (2, 66, 0));
    }

    #[test]
    fn a_queue_full_in_bytes_gives_the_message_back_but_an_empty_one_takes_any() {
        let mut q = MessageQueue::new(10, 50);
        q.push(msg(68)).unwrap();
        assert!(q.push(msg(0)).is_err());
        assert_eq!(q.pop().map(|m| m.encoded_len()), Some(100));
        assert_eq!(q.bytes(), 0);
        q.push(msg(0)).unwrap();
    }
}
