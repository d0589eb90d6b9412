//! Mapping a stream through a pool, keeping at most the pool's size of tasks in flight.

use std::future::Future;

use futures_util::{Stream, StreamExt};

use crate::error::Error;
use crate::pool::handle::Pool;

impl Pool {
    /// Runs `f(item)` for every item in a slot of this pool and yields the results in the
    /// input order. At most the pool's size of tasks run at once (fewer if other callers hold
    /// slots).
    ///
    /// # Examples
    ///
    /// ```
    /// use futures_util::{stream, StreamExt};
    /// use sluice::Pool;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let pool = Pool::with_size(3).unwrap();
    /// let out: Vec<_> = pool
    ///     .map_ordered(stream::iter(1..=5), |i| async move { i * 10 })
    ///     .map(Result::unwrap)
    ///     .collect()
    ///     .await;
    /// assert_eq!(out, vec![10, 20, 30, 40, 50]);
    /// # }
    /// ```
    pub fn map_ordered<S, F, Fut>(
        &self,
        items: S,
        f: F,
    ) -> impl Stream<Item = Result<Fut::Output, Error>>
    where
        S: Stream,
        F: FnMut(S::Item) -> Fut,
        Fut: Future,
    {
        self.tasks(items, f).buffered(self.size())
    }

    /// As [`Pool::map_ordered`], yielding results as they complete.
    pub fn map_unordered<S, F, Fut>(
        &self,
        items: S,
        f: F,
    ) -> impl Stream<Item = Result<Fut::Output, Error>>
    where
        S: Stream,
        F: FnMut(S::Item) -> Fut,
        Fut: Future,
    {
        self.tasks(items, f).buffer_unordered(self.size())
    }

    /// Each item's task, run in a slot of this pool when polled.
    fn tasks<S, F, Fut>(
        &self,
        items: S,
        mut f: F,
    ) -> impl Stream<Item = impl Future<Output = Result<Fut::Output, Error>>>
    where
        S: Stream,
        F: FnMut(S::Item) -> Fut,
        Fut: Future,
    {
        let pool = self.clone();
        items.map(move |item| {
            let (pool, task) = (pool.clone(), f(item));
            async move { pool.run(task).await }
        })
    }
}
