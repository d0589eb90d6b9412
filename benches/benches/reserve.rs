//! The cost of a reservation computed from an OpenAI-compatible request body
//! (`cost.reserve = "openai"`) beside a fixed reserve, per request: the byte bound the gateway
//! uses, and a real tokenizer (tiktoken's `o200k_base`) for comparison. Before the timings it
//! prints how tight each bound is on a sample chat request: the tokens each reserves for the
//! prompt against the prompt's true token count.
//!
//! `cargo bench -p sluice-benches --bench reserve`

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use http::HeaderMap;
use sluice_http::cost::{BodyReserve, CostSpec};

/// A chat request of about 2 KiB: a system prompt and two turns of English prose.
fn sample() -> Vec<u8> {
    let prose = "The token bucket admits a burst up to its capacity, then a steady rate. \
                 A settled cost is learnt only once the answer is over, so the gateway \
                 reserves an estimate first and settles the difference at the end. ";
    serde_json::to_vec(&serde_json::json!({
        "model": "gpt-4o-mini",
        "max_tokens": 512,
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": prose.repeat(4)},
            {"role": "assistant", "content": prose.repeat(2)},
            {"role": "user", "content": "Summarise the above in two sentences."},
        ],
    }))
    .unwrap()
}

/// The prompt's tokens as tiktoken counts them: each message's content, plus the few tokens
/// each message's framing takes (OpenAI's documented 3 per message and 3 for the reply).
fn tiktoken_prompt(bpe: &tiktoken_rs::CoreBPE, body: &[u8]) -> u64 {
    let value: serde_json::Value = serde_json::from_slice(body).unwrap();
    let messages = value["messages"].as_array().unwrap();
    let content: usize = messages
        .iter()
        .map(|m| {
            bpe.encode_ordinary(m["content"].as_str().unwrap_or(""))
                .len()
                + 3
        })
        .sum();
    content as u64 + 3
}

fn reserve(c: &mut Criterion) {
    let body = sample();
    let bpe = tiktoken_rs::o200k_base().unwrap();
    let from_body = BodyReserve::OpenAi {
        default_max_tokens: 1024,
    };
    let answer = 512;
    let by_bytes = from_body.reserve(&body) - answer;
    let by_tokenizer = tiktoken_prompt(&bpe, &body);
    println!(
        "sample body {} bytes: the byte bound reserves {by_bytes} prompt tokens, tiktoken counts {by_tokenizer} ({:.2}x)",
        body.len(),
        by_bytes as f64 / by_tokenizer as f64
    );
    let fixed = CostSpec {
        reserve: 1000,
        request: None,
        settle: None,
        from_body: None,
        max_debt: u64::MAX,
    };
    let headers = HeaderMap::new();
    let mut group = c.benchmark_group("reservation per request");
    group.bench_function("fixed reserve", |b| {
        b.iter(|| black_box(fixed.reserve_for(black_box(&headers), false, None)))
    });
    group.bench_function("openai body, byte bound", |b| {
        b.iter(|| black_box(from_body.reserve(black_box(&body))))
    });
    group.bench_function("openai body, tiktoken o200k", |b| {
        b.iter(|| black_box(tiktoken_prompt(&bpe, black_box(&body)) + answer))
    });
    group.finish();
}

criterion_group!(benches, reserve);
criterion_main!(benches);
