//! The rooms of the gateway's source stand on floors, and every import runs downward: a
//! room may use the rooms below it, never one beside or above it. A listener's module is
//! imported only by what starts it.
//!
//! | floor | rooms |
//! |---|---|
//! | 0 | `config` (parsing and checks) |
//! | 1 | `browser` (the browser limiter's paths, answered inside the main listener) |
//! | 2 | `runtime` (what one configuration builds, and what the listeners share), `bundle`, `simulate`, `stress`, `jobs` (the `sluice jobs` command) |
//! | 3 | `dashboard` (the admin page), `rls` (Envoy's rate limit service listener) |
//! | 4 | `serve/*` (the gateway and admin listeners, their connections) |
//! | 5 | `serve/mod.rs` (the process: signals, reloads, starting every listener) |
//! | 6 | `cli`, `main`, `lib` |

use std::path::Path;

fn floor(room: &str) -> Option<u8> {
    Some(match room {
        "config" => 0,
        "browser" => 1,
        "runtime" | "bundle" | "simulate" | "stress" | "jobs" => 2,
        "dashboard" | "rls" => 3,
        "serve" => 4,
        "serve/mod.rs" => 5,
        "cli" | "main" | "lib" => 6,
        _ => return None,
    })
}

/// The room of a file under `src/`: its top-level module, but the process's own file for
/// `serve/mod.rs`.
fn room_of(relative: &Path) -> String {
    let text = relative.to_string_lossy().replace('\\', "/");
    if text == "serve/mod.rs" {
        return text;
    }
    let first = text.split('/').next().unwrap_or_default();
    first.trim_end_matches(".rs").to_owned()
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_import_in_the_gateway_runs_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // The modules of `serve/`, each file but `mod.rs`.
    let listener_rooms: Vec<String> = std::fs::read_dir(src.join("serve"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            let module = name.strip_suffix(".rs")?.to_owned();
            (module != "mod").then_some(module)
        })
        .collect();
    let mut against = Vec::new();
    let mut checked = 0;
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let room = room_of(relative);
        let from = floor(&room)
            .unwrap_or_else(|| panic!("{}: room `{room}` has no floor", relative.display()));
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for (at, _) in code.match_indices("crate::") {
                let target: String = code[at + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                let target_room = if target == "serve" {
                    // `crate::serve::x::..` is a listener's room; `crate::serve::f` the process.
                    let rest = &code[at + 7 + target.len()..];
                    let next: String = rest
                        .trim_start_matches("::")
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if listener_rooms.contains(&next) {
                        "serve".to_owned()
                    } else {
                        "serve/mod.rs".to_owned()
                    }
                } else {
                    target.clone()
                };
                if target_room == room || target_room.is_empty() {
                    continue;
                }
                if room == "serve/mod.rs" && target_room == "serve" {
                    continue;
                }
                checked += 1;
                let Some(to) = floor(&target_room) else {
                    against.push(format!(
                        "{}:{}: `crate::{target}` is a room with no floor",
                        relative.display(),
                        n + 1
                    ));
                    continue;
                };
                if to >= from {
                    against.push(format!(
                        "{}:{}: {room} (floor {from}) imports {target_room} (floor {to})",
                        relative.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    eprintln!(
        "{checked} imports between rooms in {} files; {} against the floors",
        files.len(),
        against.len()
    );
    assert!(
        checked >= 40,
        "only {checked} imports found: is the scan broken?"
    );
    assert!(against.is_empty(), "{}", against.join("\n"));
}
