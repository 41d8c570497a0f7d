//! The layering ARCHITECTURE.md writes down, checked against the sources:
//! every `crate::<module>` path in a module's files points to a module on a
//! lower line of the list, so the next import cycle fails here instead of
//! growing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each module's line in ARCHITECTURE.md's list (0 = the top).
fn layers() -> BTreeMap<String, usize> {
    let text = crate::helpers::repo_file("ARCHITECTURE.md");
    let block = text
        .split("<!-- layers: begin -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- layers: end -->").next())
        .expect("the layers list");
    let mut out = BTreeMap::new();
    for (line, names) in block
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("```"))
        .enumerate()
    {
        for name in names.split_whitespace() {
            assert!(
                out.insert(name.to_owned(), line).is_none(),
                "{name} is listed twice"
            );
        }
    }
    out
}

/// The top-level module a source file belongs to (`config/tests.rs` is
/// part of `config`); `None` for the crate root and the binary.
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs");
    match name {
        "lib" | "main" => None,
        other => Some(other.to_owned()),
    }
}

/// The `crate::<module>` paths of `source`, comments left out: from
/// `crate::x::…` and from `use crate::{x, y::…}`.
fn imports(source: &str) -> BTreeSet<String> {
    let code: String = source
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or_default();
            for part in group.split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn imports_go_down_the_layers_written_in_architecture() {
    let layers = layers();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src");
        let Some(module) = module_of(rel) else {
            continue;
        };
        let Some(&from) = layers.get(&module) else {
            wrong.push(format!("{module}: not placed in ARCHITECTURE.md's layers"));
            continue;
        };
        let source = std::fs::read_to_string(&file).expect("source");
        for target in imports(&source) {
            if target == module {
                continue;
            }
            match layers.get(&target) {
                Some(&to) if to > from => {}
                Some(_) => wrong.push(format!(
                    "{} imports crate::{target}, which is not below {module}",
                    rel.display()
                )),
                None => wrong.push(format!(
                    "{} imports crate::{target}, which ARCHITECTURE.md's layers do not place",
                    rel.display()
                )),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The check itself catches what it is for.
#[test]
fn the_import_reader_finds_paths_and_groups_and_skips_comments() {
    let found = imports(
        "use crate::store::{A, B};\nuse crate::{api, dispatch::X};\n// crate::server\nlet x = crate::net::f();",
    );
    assert_eq!(
        found,
        ["api", "dispatch", "net", "store"]
            .into_iter()
            .map(str::to_owned)
            .collect()
    );
}
