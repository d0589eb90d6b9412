//! The wasm32-only part: allocator, panic handler and the single-threaded global.

use core::cell::{Cell, UnsafeCell};

#[cfg(target_feature = "atomics")]
compile_error!(
    "sluice's WebAssembly modules keep their state in a single-threaded global; build without `atomics`"
);

/// Defines the module's allocator and panic handler, in the module's own crate so that they
/// are compiled under its profile (the allocator inlines into every allocation):
///
/// - the allocator Rust's own wasm32 standard library uses, over `memory.grow`;
/// - a panic traps: the instance's current call fails with a `RuntimeError` in JavaScript,
///   which treats the instance as broken. No message is formatted, to keep the modules small;
///   nothing on either ABI panics on bad input (every conversion is total).
#[macro_export]
macro_rules! runtime {
    () => {
        #[global_allocator]
        static ALLOCATOR: $crate::dlmalloc::GlobalDlmalloc = $crate::dlmalloc::GlobalDlmalloc;

        #[panic_handler]
        fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
            core::arch::wasm32::unreachable()
        }
    };
}

/// A module's state, in a `static`, reached by its exports through [`Global::with`].
pub struct Global<T> {
    state: UnsafeCell<T>,
    /// Whether a `with` is running: a nested one traps instead of making a second reference.
    busy: Cell<bool>,
}

// Safety: wasm32 without the `atomics` target feature (refused above) has exactly one thread,
// so the cell is never reached from two threads.
unsafe impl<T> Sync for Global<T> {}

impl<T> Global<T> {
    /// The state, for a `static`.
    pub const fn new(state: T) -> Global<T> {
        Global {
            state: UnsafeCell::new(state),
            busy: Cell::new(false),
        }
    }

    /// Runs `f` on the state. A `with` inside `f` traps (no export calls another, and the
    /// modules import nothing, so it never happens).
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        if self.busy.replace(true) {
            core::arch::wasm32::unreachable();
        }
        // Safety: one thread (see the `Sync` impl), and `busy` makes this the only reference
        // until `f` returns (a panic traps: nothing runs after it).
        let state = unsafe { &mut *self.state.get() };
        let result = f(state);
        self.busy.set(false);
        result
    }
}
