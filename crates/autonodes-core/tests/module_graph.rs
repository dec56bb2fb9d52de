//! No file of a crate imports a file that imports it back, in any crate of the workspace.
//!
//! The check reads the sources: it follows `mod` declarations from each crate root, reads
//! every path that names something of the same crate (`crate::…`, `super::…`, `self::…`, a
//! child module's name, `use` trees included), follows `pub use` re-exports to the file that
//! defines the item, and looks for strongly connected files. A parent that only declares
//! its children (`mod x;`) does not import them. Paths in comments and strings do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One token of Rust source, comments and literals removed.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

fn lex(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0usize, 1usize);
    let n = c.len();
    while i < n {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && i + 1 < n && c[i + 1] == '/' {
            while i < n && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && i + 1 < n && c[i + 1] == '*' {
            let mut depth = 0;
            while i < n {
                if c[i] == '/' && i + 1 < n && c[i + 1] == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && i + 1 < n && c[i + 1] == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if (ch == 'r' || ch == 'b') && raw_string_start(&c, i).is_some() {
            let (hashes, body) = raw_string_start(&c, i).unwrap_or((0, i));
            i = body;
            loop {
                if i >= n {
                    break;
                }
                if c[i] == '"' && (0..hashes).all(|h| i + 1 + h < n && c[i + 1 + h] == '#') {
                    i += 1 + hashes;
                    break;
                }
                if c[i] == '\n' {
                    line += 1;
                }
                i += 1;
            }
        } else if ch == '"' || (ch == 'b' && i + 1 < n && c[i + 1] == '"') {
            i += if ch == 'b' { 2 } else { 1 };
            while i < n && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                if i < n && c[i] == '\n' {
                    line += 1;
                }
                i += 1;
            }
            i += 1;
        } else if ch == '\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            if i + 2 < n && c[i + 1] == '\\' {
                i += 2;
                while i < n && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if i + 2 < n && c[i + 2] == '\'' {
                i += 3;
            } else {
                i += 1;
                while i < n && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < n && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            let word = word.strip_prefix("r#").map(str::to_string).unwrap_or(word);
            out.push((Tok::Ident(word), line));
        } else if ch == ':' && i + 1 < n && c[i + 1] == ':' {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// `r"…"`, `r#"…"#`, `br"…"`: the number of hashes and where the body starts.
fn raw_string_start(c: &[char], i: usize) -> Option<(usize, usize)> {
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while c.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (c.get(j) == Some(&'"')).then_some((hashes, j + 1))
}

/// What one file says about modules: its children, its re-exports, what it defines, and
/// the paths it names (relative to the module they are written in).
#[derive(Default)]
struct FileFacts {
    /// `mod x;` declarations: (inline module path within the file, child name).
    children: Vec<(Vec<String>, String)>,
    /// `pub use` re-exports: name → absolute path.
    reexports: BTreeMap<String, Vec<String>>,
    /// `pub use m::*`: absolute module paths.
    glob_reexports: Vec<Vec<String>>,
    /// Items defined here (any depth).
    defines: BTreeSet<String>,
    /// Absolute paths named here, with their line.
    paths: Vec<(Vec<String>, usize)>,
}

const ITEM_KEYWORDS: &[&str] = &[
    "fn", "struct", "enum", "const", "static", "type", "trait", "mod", "union",
];

/// Reads a file's tokens. `module` is the file's module path; `child_names` the names of
/// the child modules declared anywhere in the crate under that path (for bare paths).
fn facts(toks: &[(Tok, usize)], module: &[String], modules: &BTreeSet<Vec<String>>) -> FileFacts {
    let mut f = FileFacts::default();
    // Inline module scopes: (brace depth at which it opened, name).
    let mut scopes: Vec<(usize, String)> = Vec::new();
    let mut depth = 0usize;
    let ident = |k: usize| match toks.get(k) {
        Some((Tok::Ident(s), _)) => Some(s.as_str()),
        _ => None,
    };
    let punct = |k: usize, p: char| matches!(toks.get(k), Some((Tok::Punct(q), _)) if *q == p);
    let sep = |k: usize| matches!(toks.get(k), Some((Tok::PathSep, _)));
    let current = |scopes: &Vec<(usize, String)>| {
        let mut m = module.to_vec();
        m.extend(scopes.iter().map(|(_, n)| n.clone()));
        m
    };
    let mut k = 0;
    while k < toks.len() {
        let line = toks[k].1;
        if punct(k, '{') {
            depth += 1;
            k += 1;
            continue;
        }
        if punct(k, '}') {
            depth = depth.saturating_sub(1);
            if scopes.last().is_some_and(|(d, _)| *d == depth) {
                scopes.pop();
            }
            k += 1;
            continue;
        }
        if let Some(kw) = ident(k) {
            if ITEM_KEYWORDS.contains(&kw) && !sep(k + 1) {
                if let Some(name) = ident(k + 1) {
                    f.defines.insert(name.to_string());
                    if kw == "mod" {
                        if punct(k + 2, ';') {
                            let inline: Vec<String> =
                                scopes.iter().map(|(_, n)| n.clone()).collect();
                            f.children.push((inline, name.to_string()));
                        } else if punct(k + 2, '{') {
                            scopes.push((depth, name.to_string()));
                            depth += 1;
                            k += 3;
                            continue;
                        }
                    }
                }
            }
            if kw == "macro_rules" {
                if let Some(name) = ident(k + 2) {
                    f.defines.insert(name.to_string());
                }
            }
            if kw == "use" && !sep(k.wrapping_sub(1)) {
                let public = k > 0
                    && (ident(k - 1) == Some("pub")
                        || (punct(k - 1, ')')
                            && (1..5).any(|b| ident(k.saturating_sub(b)) == Some("pub"))));
                let here = current(&scopes);
                let mut leaves = Vec::new();
                let end = use_tree(toks, k + 1, Vec::new(), &mut leaves);
                for (path, alias, line) in leaves {
                    let Some(abs) = absolute(&path, &here, modules, true) else {
                        continue;
                    };
                    if public {
                        match alias.as_deref() {
                            Some("*") => f.glob_reexports.push(abs.clone()),
                            Some("self") | None => {
                                if let Some(last) = abs.last() {
                                    f.reexports.insert(last.clone(), abs.clone());
                                }
                            }
                            Some(a) => {
                                f.reexports.insert(a.to_string(), abs.clone());
                            }
                        }
                    }
                    f.paths.push((abs, line));
                }
                k = end;
                continue;
            }
            // A path in code: `a::b::c` not preceded by `::`.
            if sep(k + 1) && !sep(k.wrapping_sub(1)) {
                let mut path = vec![kw.to_string()];
                let mut j = k + 1;
                while sep(j) {
                    match ident(j + 1) {
                        Some(s) => {
                            path.push(s.to_string());
                            j += 2;
                        }
                        None => break,
                    }
                }
                let here = current(&scopes);
                if let Some(abs) = absolute(&path, &here, modules, false) {
                    f.paths.push((abs, line));
                }
                k = j;
                continue;
            }
        }
        k += 1;
    }
    f
}

/// Parses a `use` tree from `k`; pushes (path, alias or "*", line) leaves; returns the
/// index after the tree's end (`;`).
fn use_tree(
    toks: &[(Tok, usize)],
    mut k: usize,
    mut prefix: Vec<String>,
    leaves: &mut Vec<(Vec<String>, Option<String>, usize)>,
) -> usize {
    loop {
        match toks.get(k) {
            Some((Tok::Ident(s), line)) => {
                let line = *line;
                if s == "as" {
                    if let Some((Tok::Ident(a), _)) = toks.get(k + 1) {
                        if let Some(last) = leaves.last_mut() {
                            last.1 = Some(a.clone());
                        }
                    }
                    k += 2;
                    continue;
                }
                prefix.push(s.clone());
                k += 1;
                if matches!(toks.get(k), Some((Tok::PathSep, _))) {
                    k += 1;
                    continue;
                }
                leaves.push((prefix.clone(), None, line));
                prefix.pop();
                return skip_alias(toks, k, leaves);
            }
            Some((Tok::Punct('*'), line)) => {
                leaves.push((prefix.clone(), Some("*".into()), *line));
                return k + 1;
            }
            Some((Tok::Punct('{'), _)) => {
                k += 1;
                loop {
                    if matches!(toks.get(k), Some((Tok::Punct('}'), _))) {
                        return k + 1;
                    }
                    k = use_tree(toks, k, prefix.clone(), leaves);
                    if matches!(toks.get(k), Some((Tok::Punct(','), _))) {
                        k += 1;
                    }
                    if k >= toks.len() {
                        return k;
                    }
                }
            }
            _ => return k + 1,
        }
    }
}

fn skip_alias(
    toks: &[(Tok, usize)],
    k: usize,
    leaves: &mut [(Vec<String>, Option<String>, usize)],
) -> usize {
    if matches!(toks.get(k), Some((Tok::Ident(s), _)) if s == "as") {
        if let Some((Tok::Ident(a), _)) = toks.get(k + 1) {
            if let Some(last) = leaves.last_mut() {
                last.1 = Some(a.clone());
            }
        }
        return k + 2;
    }
    k
}

/// The absolute module path a path names, if it names something of this crate.
fn absolute(
    path: &[String],
    here: &[String],
    modules: &BTreeSet<Vec<String>>,
    in_use: bool,
) -> Option<Vec<String>> {
    let first = path.first()?;
    let mut abs: Vec<String>;
    let mut rest = &path[1..];
    match first.as_str() {
        "crate" => abs = Vec::new(),
        "self" => abs = here.to_vec(),
        "super" => {
            abs = here.to_vec();
            abs.pop();
            while rest.first().is_some_and(|s| s == "super") {
                abs.pop();
                rest = &rest[1..];
            }
        }
        name => {
            let mut child = here.to_vec();
            child.push(name.to_string());
            if modules.contains(&child) {
                abs = here.to_vec();
                rest = path;
            } else {
                let _ = in_use;
                return None;
            }
        }
    }
    abs.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(abs)
}

struct Crate {
    files: BTreeMap<Vec<String>, PathBuf>,
}

/// Follows `mod` declarations from a crate root.
fn crate_files(root: &Path) -> Crate {
    let mut files = BTreeMap::new();
    let mut todo = vec![(Vec::<String>::new(), root.to_path_buf())];
    while let Some((module, file)) = todo.pop() {
        let src = std::fs::read_to_string(&file).unwrap_or_default();
        let toks = lex(&src);
        let f = facts(&toks, &module, &BTreeSet::new());
        let is_dir_owner = matches!(
            file.file_name().and_then(|n| n.to_str()),
            Some("mod.rs" | "lib.rs" | "main.rs")
        );
        let base = if is_dir_owner {
            file.parent().unwrap_or(Path::new(".")).to_path_buf()
        } else {
            file.with_extension("")
        };
        for (inline, child) in &f.children {
            let mut dir = base.clone();
            for s in inline {
                dir.push(s);
            }
            let candidates = [
                dir.join(format!("{child}.rs")),
                dir.join(child).join("mod.rs"),
            ];
            if let Some(found) = candidates.iter().find(|p| p.exists()) {
                let mut m = module.clone();
                m.extend(inline.iter().cloned());
                m.push(child.clone());
                todo.push((m, found.clone()));
            }
        }
        files.insert(module, file);
    }
    Crate { files }
}

/// The file an absolute path lands in, following re-exports.
fn resolve(
    abs: &[String],
    krate: &Crate,
    facts: &BTreeMap<Vec<String>, FileFacts>,
    hops: usize,
) -> Option<Vec<String>> {
    let file = (0..=abs.len())
        .rev()
        .map(|l| abs[..l].to_vec())
        .find(|p| krate.files.contains_key(p))?;
    let rest = &abs[file.len()..];
    if hops > 8 || rest.is_empty() {
        return Some(file);
    }
    let f = &facts[&file];
    if !f.defines.contains(&rest[0]) {
        if let Some(target) = f.reexports.get(&rest[0]) {
            let mut next = target.clone();
            next.extend(rest[1..].iter().cloned());
            if next != abs {
                return resolve(&next, krate, facts, hops + 1);
            }
        }
        for glob in &f.glob_reexports {
            let mut next = glob.clone();
            next.extend(rest.iter().cloned());
            if let Some(target) = resolve(&next, krate, facts, hops + 1) {
                if target != file && facts[&target].defines.contains(&rest[0]) {
                    return Some(target);
                }
            }
        }
    }
    Some(file)
}

/// Strongly connected groups of more than one file (Tarjan).
fn cycles(edges: &Edges) -> Vec<Vec<Vec<String>>> {
    struct T<'a> {
        edges: &'a Edges,
        index: BTreeMap<Vec<String>, usize>,
        low: BTreeMap<Vec<String>, usize>,
        stack: Vec<Vec<String>>,
        on: BTreeSet<Vec<String>>,
        next: usize,
        out: Vec<Vec<Vec<String>>>,
    }
    fn visit(t: &mut T, v: &Vec<String>) {
        t.index.insert(v.clone(), t.next);
        t.low.insert(v.clone(), t.next);
        t.next += 1;
        t.stack.push(v.clone());
        t.on.insert(v.clone());
        let targets: Vec<Vec<String>> = t
            .edges
            .get(v)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        for w in targets {
            if !t.index.contains_key(&w) {
                visit(t, &w);
                let lw = t.low[&w];
                let lv = t.low[v];
                t.low.insert(v.clone(), lv.min(lw));
            } else if t.on.contains(&w) {
                let iw = t.index[&w];
                let lv = t.low[v];
                t.low.insert(v.clone(), lv.min(iw));
            }
        }
        if t.low[v] == t.index[v] {
            let mut group = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(&w);
                let done = &w == v;
                group.push(w);
                if done {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                t.out.push(group);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    let nodes: Vec<Vec<String>> = edges.keys().cloned().collect();
    for v in nodes {
        if !t.index.contains_key(&v) {
            visit(&mut t, &v);
        }
    }
    t.out
}

/// Import edges: file → (file it imports → the first line that does).
type Edges = BTreeMap<Vec<String>, BTreeMap<Vec<String>, usize>>;

/// The import edges between the files of one crate root: file → (file → first line).
fn import_edges(root: &Path) -> (Crate, Edges) {
    let krate = crate_files(root);
    let modules: BTreeSet<Vec<String>> = krate.files.keys().cloned().collect();
    let all: BTreeMap<Vec<String>, FileFacts> = krate
        .files
        .iter()
        .map(|(m, p)| {
            let src = std::fs::read_to_string(p).unwrap_or_default();
            (m.clone(), facts(&lex(&src), m, &modules))
        })
        .collect();
    let mut edges: Edges = BTreeMap::new();
    for (m, f) in &all {
        let out = edges.entry(m.clone()).or_default();
        for (abs, line) in &f.paths {
            if let Some(target) = resolve(abs, &krate, &all, 0) {
                if &target != m {
                    out.entry(target).or_insert(*line);
                }
            }
        }
    }
    (krate, edges)
}

fn workspace_roots() -> Vec<PathBuf> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the core sits in crates/")
        .to_path_buf();
    let mut roots = Vec::new();
    for entry in std::fs::read_dir(&crates)
        .expect("crates/ is readable")
        .flatten()
    {
        for root in ["src/lib.rs", "src/main.rs"] {
            let p = entry.path().join(root);
            if p.exists() {
                roots.push(p);
            }
        }
    }
    roots.sort();
    roots
}

/// A path from `crates/` on.
fn short(p: &Path) -> String {
    let s = p.display().to_string();
    s.find("crates/").map(|i| s[i..].to_string()).unwrap_or(s)
}

/// For each file of a strongly connected group, one shortest way back to it, each cycle
/// once (the files in order, the first repeated at the end).
fn shortest_cycles(group: &[Vec<String>], edges: &Edges) -> Vec<Vec<Vec<String>>> {
    let mut seen: BTreeSet<Vec<Vec<String>>> = BTreeSet::new();
    let mut out = Vec::new();
    for start in group {
        let mut prev: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.clone()]);
        let mut found = None;
        while let Some(v) = queue.pop_front() {
            for w in edges[&v].keys().filter(|w| group.contains(w)) {
                if w == start {
                    found = Some(v.clone());
                    break;
                }
                if !prev.contains_key(w) {
                    prev.insert(w.clone(), v.clone());
                    queue.push_back(w.clone());
                }
            }
            if found.is_some() {
                break;
            }
        }
        let Some(mut last) = found else { continue };
        let mut cycle = vec![last.clone()];
        while &last != start {
            last = prev[&last].clone();
            cycle.push(last.clone());
        }
        cycle.reverse();
        let mut key = cycle.clone();
        key.sort();
        if seen.insert(key) {
            cycle.push(start.clone());
            out.push(cycle);
        }
    }
    out
}

#[test]
fn no_file_of_a_crate_imports_a_file_that_imports_it_back() {
    let mut report = String::new();
    let mut files = 0;
    for root in workspace_roots() {
        let (krate, edges) = import_edges(&root);
        files += krate.files.len();
        for group in cycles(&edges) {
            report.push_str(&format!("\nin {}:\n", root.display()));
            for cycle in shortest_cycles(&group, &edges) {
                let names: Vec<String> = cycle
                    .windows(2)
                    .map(|w| {
                        let line = edges[&w[0]][&w[1]];
                        format!("{}:{line}", short(&krate.files[&w[0]]))
                    })
                    .collect();
                report.push_str(&format!(
                    "  {} -> {}\n",
                    names.join(" -> "),
                    short(&krate.files[&cycle[0]])
                ));
            }
        }
    }
    assert!(files > 100, "the check found only {files} files");
    assert!(report.is_empty(), "files that import each other:{report}");
    println!("{files} files, no import cycle");
}

#[test]
fn the_module_graph_check_sees_a_cycle_through_a_child_and_a_reexport() {
    let dir = std::env::temp_dir().join(format!("module-graph-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).expect("temp dir");
    let write = |p: &str, s: &str| std::fs::write(src.join(p), s).expect("write");
    write(
        "lib.rs",
        "pub mod a;\npub mod b;\n// crate::b::never in a comment\n",
    );
    write(
        "a.rs",
        "mod inner;\npub use inner::Thing;\npub fn f() { crate::b::g(); }\n",
    );
    write(
        "a/inner.rs",
        "pub struct Thing;\n#[cfg(test)]\nmod tests { use super::*; }\n",
    );
    write(
        "b.rs",
        "use crate::a::Thing;\npub fn g() { let _s = \"crate::a::f\"; }\n",
    );
    let (krate, edges) = import_edges(&src.join("lib.rs"));
    assert_eq!(krate.files.len(), 4);
    // b names a::Thing, which a re-exports from a/inner: the edge goes to inner, no cycle.
    assert!(cycles(&edges).is_empty(), "{edges:?}");
    write(
        "a/inner.rs",
        "pub struct Thing;\npub fn h() { super::f(); crate::b::g(); }\n",
    );
    write(
        "b.rs",
        "use crate::a::{self, Thing};\npub fn g() { a::f(); }\n",
    );
    let (_, edges) = import_edges(&src.join("lib.rs"));
    let found = cycles(&edges);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(found.len(), 1, "{edges:?}");
    assert_eq!(found[0].len(), 3, "{found:?}");
}

/// The imports from a file under module `lower` to a file outside it that is under one of
/// `upper`: `file:line -> file`, one per pair.
fn upward_imports(krate: &Crate, edges: &Edges, lower: &str, upper: &[&str]) -> Vec<String> {
    let under = |m: &[String], top: &str| m.first().is_some_and(|s| s == top);
    let mut out = Vec::new();
    for (from, targets) in edges.iter().filter(|(m, _)| under(m, lower)) {
        for (to, line) in targets {
            if !under(to, lower) && upper.iter().any(|u| under(to, u)) {
                out.push(format!(
                    "{}:{line} -> {}",
                    short(&krate.files[from]),
                    short(&krate.files[to])
                ));
            }
        }
    }
    out
}

/// What the code that talks to host and tenant clusters may not import: the controllers
/// and everything built on them.
const ABOVE_REMOTE: &[&str] = &["controller", "run", "cli", "explain", "server", "leader"];

#[test]
fn nothing_under_remote_imports_the_controllers_or_what_runs_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../autonodes/src/lib.rs");
    let (krate, edges) = import_edges(&root);
    assert!(
        krate
            .files
            .keys()
            .filter(|m| m.first().is_some_and(|s| s == "remote"))
            .count()
            > 5,
        "the check found no remote/ files under {}",
        root.display()
    );
    let upward = upward_imports(&krate, &edges, "remote", ABOVE_REMOTE);
    assert!(
        upward.is_empty(),
        "remote/ reaches up into the code that uses it:\n  {}",
        upward.join("\n  ")
    );
}

#[test]
fn the_layer_check_refuses_an_import_from_remote_into_the_controllers() {
    let dir = std::env::temp_dir().join(format!("module-layers-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("remote")).expect("temp dir");
    std::fs::create_dir_all(src.join("controller")).expect("temp dir");
    let write = |p: &str, s: &str| std::fs::write(src.join(p), s).expect("write");
    write("lib.rs", "pub mod controller;\npub mod remote;\n");
    write("controller/mod.rs", "pub mod context;\n");
    write(
        "controller/context.rs",
        "use crate::remote::calls::Caller;\npub struct Context;\n",
    );
    write("remote/mod.rs", "pub mod calls;\n");
    write(
        "remote/calls.rs",
        "pub struct Caller;\n// crate::controller::context::Context in a comment\n",
    );
    let (krate, edges) = import_edges(&src.join("lib.rs"));
    assert!(upward_imports(&krate, &edges, "remote", ABOVE_REMOTE).is_empty());
    write(
        "remote/calls.rs",
        "use crate::controller::context::Context;\npub struct Caller;\n",
    );
    let (krate, edges) = import_edges(&src.join("lib.rs"));
    let found = upward_imports(&krate, &edges, "remote", ABOVE_REMOTE);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("remote/calls.rs:1 -> "), "{found:?}");
    assert!(found[0].ends_with("controller/context.rs"), "{found:?}");
}
