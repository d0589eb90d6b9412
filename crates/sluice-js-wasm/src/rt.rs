//! What a `no_std` cdylib for wasm32 must bring itself: an allocator and a panic handler.

/// The allocator Rust's own wasm32 standard library uses, over `memory.grow`.
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// A panic traps: the current call fails with a `RuntimeError` in JavaScript. Nothing on the
/// ABI panics on bad input (every conversion is total), and no message is formatted.
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}
