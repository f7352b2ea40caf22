//! The applier's source files form a DAG: no file reaches back, through the items it
//! names, to a file that names it (docs/ARCHITECTURE.md, "Code map").
//!
//! Every `applier/src/**.rs` file is parsed (`syn`) and each path it names that leads into
//! the crate — `use crate::…`, `use super::…`, `self::…`, a path through a child module
//! (`reopen::Store` in the file that declares `mod reopen`), also inside macro calls — is
//! an edge from that file to the file of the deepest module the path names
//! (`crate::store::binlog::Binlog` → `store/binlog.rs`, `crate::store::Store` →
//! `store/mod.rs`). Re-exports count like any other use: a file that names its parent's
//! re-export depends on the parent, which depends on the re-exported file. `mod x;`
//! declarations are containment, not use; `pub(super)` says who may see an item, not what
//! it uses; and items and files under `#[cfg(test)]` are left out (a unit test may drive
//! its module through the layers above it).
//!
//! A cycle fails the test, printed file by file with the path that makes each step.
//! `MODULE_GRAPH_PRINT=1 cargo test -p tidelog-applier --test module_graph -- --nocapture`
//! prints every file's edges.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// A module path inside the crate (`[]` is the crate root).
type ModPath = Vec<String>;

/// Collects the crate-relative paths one file names.
struct Collector<'a> {
    /// The module being visited (the file's, then inline modules inside it).
    scope: ModPath,
    /// Per open scope, the child modules it declares (a path may start with one).
    children: Vec<BTreeSet<String>>,
    refs: &'a mut Vec<(ModPath, String)>,
}

fn cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string().trim() == "test")
    })
}

fn child_mods(items: &[syn::Item]) -> BTreeSet<String> {
    items
        .iter()
        .filter_map(|i| match i {
            syn::Item::Mod(m) => Some(m.ident.to_string()),
            _ => None,
        })
        .collect()
}

impl Collector<'_> {
    /// `segs` (as written in the current scope) as a module path from the crate root, when
    /// it leads into the crate.
    fn resolve(&self, segs: &[String]) -> Option<ModPath> {
        let first = segs.first()?;
        let mut base = self.scope.clone();
        let mut rest = segs;
        match first.as_str() {
            "crate" => {
                base.clear();
                rest = &segs[1..];
            }
            "self" => rest = &segs[1..],
            "super" => {
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
            }
            name if self.children.last().is_some_and(|c| c.contains(name)) => {}
            _ => return None,
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn note(&mut self, segs: &[String]) {
        if let Some(p) = self.resolve(segs) {
            self.refs.push((p, segs.join("::")));
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                if name == "self" {
                    self.note(&prefix.clone());
                } else {
                    prefix.push(name);
                    self.note(&prefix.clone());
                    prefix.pop();
                }
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.note(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.note(&prefix.clone()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    /// `crate :: a :: b` (and `super`/`self`) sequences in a macro's tokens.
    fn tokens(&mut self, ts: TokenStream) {
        let tts: Vec<TokenTree> = ts.into_iter().collect();
        let mut i = 0;
        while i < tts.len() {
            match &tts[i] {
                TokenTree::Group(g) => {
                    self.tokens(g.stream());
                    i += 1;
                }
                TokenTree::Ident(id)
                    if matches!(id.to_string().as_str(), "crate" | "super" | "self") =>
                {
                    let mut segs = vec![id.to_string()];
                    let mut j = i + 1;
                    // `::` is two `:` puncts, then an identifier.
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(n)),
                    ) = (tts.get(j), tts.get(j + 1), tts.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        segs.push(n.to_string());
                        j += 3;
                    }
                    if segs.len() > 1 {
                        self.note(&segs);
                    }
                    i = j;
                }
                _ => i += 1,
            }
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        let attrs = match i {
            syn::Item::Const(x) => &x.attrs,
            syn::Item::Enum(x) => &x.attrs,
            syn::Item::Fn(x) => &x.attrs,
            syn::Item::Impl(x) => &x.attrs,
            syn::Item::Mod(x) => &x.attrs,
            syn::Item::Static(x) => &x.attrs,
            syn::Item::Struct(x) => &x.attrs,
            syn::Item::Trait(x) => &x.attrs,
            syn::Item::Type(x) => &x.attrs,
            syn::Item::Use(x) => &x.attrs,
            syn::Item::Macro(x) => &x.attrs,
            _ => return syn::visit::visit_item(self, i),
        };
        if !cfg_test(attrs) {
            syn::visit::visit_item(self, i);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        // `mod x;` is declared containment; only an inline module's body is visited.
        if let Some((_, items)) = &m.content {
            self.scope.push(m.ident.to_string());
            self.children.push(child_mods(items));
            for i in items {
                self.visit_item(i);
            }
            self.children.pop();
            self.scope.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.note(&segs);
        syn::visit::visit_path(self, p);
    }

    /// `pub(super)` and `pub(in crate::x)` say who may see an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !cfg_test(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
}

/// The module path of a file under `src/` (`store/mod.rs` → `store`, `lib.rs` → root).
fn mod_path(rel: &Path) -> ModPath {
    let mut segs: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if segs
        .last()
        .is_some_and(|s| s == "mod" || s == "lib" || s == "main")
    {
        segs.pop();
    }
    segs
}

/// Each file (by its path under `src/`) and the files it names, each with the path that
/// named it first.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

/// The file-level graph of `files` (path under `src/` → source text).
fn graph(files: &BTreeMap<String, String>) -> Graph {
    let parsed: BTreeMap<&String, syn::File> = files
        .iter()
        .map(|(f, src)| {
            let ast = syn::parse_file(src).unwrap_or_else(|e| panic!("{f}: does not parse: {e}"));
            (f, ast)
        })
        .collect();
    // Files declared `#[cfg(test)] mod x;` hold tests only, like inline test modules.
    let test_only: BTreeSet<ModPath> = parsed
        .iter()
        .flat_map(|(f, ast)| {
            let scope = mod_path(Path::new(f.as_str()));
            ast.items.iter().filter_map(move |i| match i {
                syn::Item::Mod(m) if m.content.is_none() && cfg_test(&m.attrs) => {
                    let mut p = scope.clone();
                    p.push(m.ident.to_string());
                    Some(p)
                }
                _ => None,
            })
        })
        .collect();
    let by_mod: BTreeMap<ModPath, String> = files
        .keys()
        .map(|f| (mod_path(Path::new(f)), f.clone()))
        .collect();
    let mut g = Graph::new();
    for (file, ast) in parsed {
        let scope = mod_path(Path::new(file));
        if test_only.iter().any(|t| scope.starts_with(t)) {
            continue;
        }
        let mut refs = Vec::new();
        let mut c = Collector {
            scope,
            children: vec![child_mods(&ast.items)],
            refs: &mut refs,
        };
        for item in &ast.items {
            c.visit_item(item);
        }
        let out = g.entry(file.clone()).or_default();
        for (target, written) in refs {
            // The deepest module along the path that is a file of its own.
            let to = (0..=target.len())
                .rev()
                .find_map(|n| by_mod.get(&target[..n]))
                .unwrap_or_else(|| panic!("{file}: {written}: no file for the crate root"));
            if to != file {
                out.entry(to.clone()).or_insert(written);
            }
        }
    }
    g
}

/// Each strongly connected component with more than one file: the files that reach one
/// another, with the cycles that join them.
fn cycles(g: &Graph) -> Vec<Cycles> {
    // Tarjan's algorithm, then a shortest way back to each file inside its component.
    struct T<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        comps: Vec<BTreeSet<&'a str>>,
    }
    fn strong<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flat_map(|m| m.keys()) {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                strong(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = BTreeSet::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.insert(w);
                if w == v {
                    break;
                }
            }
            t.comps.push(comp);
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        comps: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            strong(&mut t, v);
        }
    }
    t.comps
        .iter()
        .filter(|c| c.len() > 1)
        .map(|comp| {
            let mut found: Vec<Vec<String>> = Vec::new();
            for start in comp {
                let c = shortest_cycle(g, comp, start);
                // The same cycle from another of its files.
                let mut key = c[1..].to_vec();
                key.sort();
                if !found.iter().any(|f| {
                    let mut k = f[1..].to_vec();
                    k.sort();
                    k == key
                }) {
                    found.push(c);
                }
            }
            Cycles {
                files: comp.iter().map(|s| s.to_string()).collect(),
                cycles: found,
            }
        })
        .collect()
}

/// The files of one strongly connected component, and the shortest cycle through each
/// of them (each cycle once).
#[derive(Debug)]
struct Cycles {
    files: Vec<String>,
    cycles: Vec<Vec<String>>,
}

/// A shortest cycle from `start` back to it inside `comp` (the first file repeated last).
fn shortest_cycle(g: &Graph, comp: &BTreeSet<&str>, start: &str) -> Vec<String> {
    let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    'search: while let Some(v) = queue.pop_front() {
        for w in g[v].keys().map(String::as_str).filter(|w| comp.contains(w)) {
            if w == start {
                prev.insert(start, v);
                break 'search;
            }
            if !prev.contains_key(w) {
                prev.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    let mut path = vec![start.to_string()];
    let mut at = prev[start];
    while at != start {
        path.push(at.to_string());
        at = prev[at];
    }
    path.push(start.to_string());
    path.reverse();
    path
}

/// A cycle as the report prints it: each step with the path that makes it.
fn describe(g: &Graph, cycle: &[String]) -> String {
    let mut s = cycle[0].clone();
    for w in cycle.windows(2) {
        s.push_str(&format!("\n    → {} (names `{}`)", w[1], g[&w[0]][&w[1]]));
    }
    s
}

fn read_sources(dir: &Path, under: &Path, out: &mut BTreeMap<String, String>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            read_sources(&p, under, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let rel = p
                .strip_prefix(under)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.insert(rel, std::fs::read_to_string(&p).unwrap());
        }
    }
}

fn applier_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    read_sources(&src, &src, &mut files);
    assert!(
        files.len() > 20,
        "only {} files under {}",
        files.len(),
        src.display()
    );
    graph(&files)
}

#[test]
fn applier_files_form_a_dag() {
    let g = applier_graph();
    if std::env::var_os("MODULE_GRAPH_PRINT").is_some() {
        for (file, to) in &g {
            let names: Vec<&str> = to.keys().map(String::as_str).collect();
            println!("{file} → {}", names.join(", "));
        }
    }
    // The collector sees the references (a graph without edges has no cycles either).
    assert!(
        g.iter()
            .any(|(f, to)| f.starts_with("apply") && to.keys().any(|t| t.starts_with("store"))),
        "the apply stage's edge to the store not found"
    );
    let found = cycles(&g);
    let report: Vec<String> = found
        .iter()
        .map(|c| {
            let each: Vec<String> = c.cycles.iter().map(|c| describe(&g, c)).collect();
            format!(
                "files that import one another: {}\n  {}",
                c.files.join(", "),
                each.join("\n  ")
            )
        })
        .collect();
    assert!(
        found.is_empty(),
        "import cycles among the applier's files:\n{}",
        report.join("\n")
    );
}

#[test]
fn store_files_name_no_stage_above_them() {
    let g = applier_graph();
    // The stages above the store, a file or a folder each.
    let above = |t: &str| {
        ["apply", "consistency", "retention"]
            .iter()
            .any(|s| t == format!("{s}.rs") || t.starts_with(&format!("{s}/")))
    };
    let wrong: Vec<String> = g
        .iter()
        .filter(|(f, _)| *f == "store.rs" || f.starts_with("store/"))
        .flat_map(|(f, to)| {
            to.iter()
                .filter(|(t, _)| above(t))
                .map(move |(t, w)| format!("{f} → {t} (names `{w}`)"))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "store files name a stage above the store:\n  {}",
        wrong.join("\n  ")
    );
}

/// The checker itself: a cycle through a re-export, a `super::` path, a child-module path
/// and a macro is found and printed; test-only code, `pub(super)` and `mod` declarations
/// add no edge.
#[test]
fn a_cycle_in_made_up_sources_is_found() {
    let files: BTreeMap<String, String> = [
        ("lib.rs", "pub mod a; pub mod b; mod c; #[cfg(test)] mod t;"),
        ("t.rs", "use crate::b::g;"),
        (
            "a/mod.rs",
            "mod x; pub use x::X; pub fn f() { crate::b::g(); }",
        ),
        (
            "a/x.rs",
            "pub struct X; fn h() { let _ = format!(\"{}\", crate::c::C); }",
        ),
        (
            "b.rs",
            "pub(super) fn g() { crate::t::h(); } #[cfg(test)] mod tests { use crate::a::X; }",
        ),
        (
            "c.rs",
            "pub const C: u8 = 0; pub fn k() -> super::a::X { todo!() }",
        ),
    ]
    .into_iter()
    .map(|(f, s)| (f.to_string(), s.to_string()))
    .collect();
    let g = graph(&files);
    assert!(
        !g.contains_key("t.rs"),
        "a file declared under #[cfg(test)] was read"
    );
    assert_eq!(
        g["b.rs"].keys().collect::<Vec<_>>(),
        ["t.rs"],
        "test-only code or a visibility made an edge"
    );
    assert!(
        g["lib.rs"].is_empty(),
        "`mod` declarations made edges: {:?}",
        g["lib.rs"]
    );
    let found = cycles(&g);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].files, ["a/mod.rs", "a/x.rs", "c.rs"]);
    assert_eq!(found[0].cycles.len(), 1, "{found:?}");
    let text = describe(&g, &found[0].cycles[0]);
    assert!(text.contains("crate::c::C"), "{text}");
    assert!(text.contains("super::a::X"), "{text}");
    assert!(text.contains("x::X"), "{text}");
}
