//! The book under `docs/` and the READMEs: the book builds with mdBook, every link between
//! its pages, the READMEs and the repository resolves (anchors included), every condition
//! reason a user can see has a troubleshooting entry, each fact stated in several places
//! agrees with its one source (the Rust version, the kinds, the alerts, the
//! architectures), and the references generated from the code (the flags of `autonodes`,
//! the chart's values) are what the code says.
//!
//! `AUTONODES_UPDATE_DOCS=1` rewrites the generated pages after an intended change.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use autonodes_api::reasons::{ClaimReason, PoolReason, ProviderReason, QuotaReason, TypeReason};
use clap::CommandFactory;
use pulldown_cmark::{Event, Parser, Tag, TagEnd};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Compares a generated file with what is committed; rewrites it with
/// `AUTONODES_UPDATE_DOCS=1`.
fn check_generated(path: &Path, generated: &str) {
    if std::env::var_os("AUTONODES_UPDATE_DOCS").is_some() {
        std::fs::write(path, generated).unwrap();
        return;
    }
    let committed = read(path);
    if committed != generated {
        let first = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map(|i| {
                format!(
                    "line {}: committed {:?}, generated {:?}",
                    i + 1,
                    committed.lines().nth(i).unwrap_or(""),
                    generated.lines().nth(i).unwrap_or("")
                )
            })
            .unwrap_or_else(|| "the files differ in length".to_string());
        panic!(
            "{} is stale ({first}); run `AUTONODES_UPDATE_DOCS=1 cargo test -p autonodes --test it docs::` and commit it",
            path.display()
        );
    }
}

/// The files under `dirs` (recursively) whose extension is one of `extensions`.
fn files_under(mut dirs: Vec<PathBuf>, extensions: &[&str]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path
                .extension()
                .is_some_and(|e| extensions.iter().any(|x| e == *x))
            {
                files.push(path);
            }
        }
    }
    files
}

/// Every Markdown file the checks read: the book's sources and the READMEs.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![
        root().join("README.md"),
        root().join("charts/autonodes/README.md"),
    ];
    files.extend(files_under(vec![root().join("docs/src")], &["md"]));
    files.sort();
    files
}

/// The anchor mdBook (and GitHub) gives a heading: lower case, spaces to `-`, everything
/// but letters, digits, `-` and `_` dropped; a repeated anchor gets `-1`, `-2`, ….
fn anchor_of(text: &str) -> String {
    text.chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_ascii_lowercase())
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// A Markdown file's heading anchors and link targets (with their line numbers).
struct Page {
    anchors: BTreeSet<String>,
    links: Vec<(usize, String)>,
}

fn parse_page(text: &str) -> Page {
    let mut anchors = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut links = Vec::new();
    let mut heading: Option<String> = None;
    for (event, range) in Parser::new(text).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { id, .. }) => {
                if let Some(id) = id {
                    anchors.insert(id.to_string());
                }
                heading = Some(String::new());
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some(h) = heading.take() {
                    let base = anchor_of(&h);
                    let n = seen.entry(base.clone()).or_insert(0);
                    let anchor = if *n == 0 {
                        base.clone()
                    } else {
                        format!("{base}-{n}")
                    };
                    *n += 1;
                    anchors.insert(anchor);
                }
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => {
                let line = text[..range.start].lines().count().max(1);
                links.push((line, dest_url.to_string()));
            }
            _ => {}
        }
    }
    Page { anchors, links }
}

#[test]
fn every_link_of_the_book_and_the_readmes_resolves_to_a_file_and_anchor_that_exist() {
    let files = markdown_files();
    let pages: BTreeMap<PathBuf, Page> = files
        .iter()
        .map(|f| (f.canonicalize().unwrap(), parse_page(&read(f))))
        .collect();
    let mut broken = Vec::new();
    let mut checked = 0;
    for (file, page) in &pages {
        for (line, link) in &page.links {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = match link.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                file.clone()
            } else {
                match file.parent().unwrap().join(path).canonicalize() {
                    Ok(t) => t,
                    Err(_) => {
                        broken.push(format!("{}:{line}: {link}: no such file", file.display()));
                        continue;
                    }
                }
            };
            if let Some(fragment) = fragment {
                match pages.get(&target) {
                    Some(p) if p.anchors.contains(fragment) => {}
                    Some(_) => broken.push(format!(
                        "{}:{line}: {link}: no heading with anchor #{fragment}",
                        file.display()
                    )),
                    None => broken.push(format!(
                        "{}:{line}: {link}: an anchor into a file that is not Markdown",
                        file.display()
                    )),
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} internal links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_chapter_of_the_book_is_in_its_summary_and_every_summary_entry_exists() {
    let src = root().join("docs/src");
    let summary = parse_page(&read(&src.join("SUMMARY.md")));
    let listed: BTreeSet<PathBuf> = summary
        .links
        .iter()
        .map(|(_, l)| src.join(l).canonicalize().unwrap_or_else(|_| src.join(l)))
        .collect();
    for chapter in &listed {
        assert!(
            chapter.exists(),
            "SUMMARY.md lists {} which does not exist",
            chapter.display()
        );
    }
    for file in markdown_files() {
        let file = file.canonicalize().unwrap();
        if file.starts_with(src.canonicalize().unwrap()) && !file.ends_with("SUMMARY.md") {
            assert!(
                listed.contains(&file),
                "{} is not in SUMMARY.md",
                file.display()
            );
        }
    }
}

#[test]
fn every_condition_reason_a_user_can_see_has_a_troubleshooting_entry() {
    let page = read(&root().join("docs/src/troubleshooting.md"));
    let mut reasons: BTreeSet<&str> = BTreeSet::new();
    reasons.extend(ClaimReason::ALL.iter().map(|r| r.as_str()));
    reasons.extend(PoolReason::ALL.iter().map(|r| r.as_str()));
    reasons.extend(QuotaReason::ALL.iter().map(|r| r.as_str()));
    reasons.extend(ProviderReason::ALL.iter().map(|r| r.as_str()));
    reasons.extend(TypeReason::ALL.iter().map(|r| r.as_str()));
    // Any kind that does not decode (controller/invalid.rs).
    reasons.insert("InvalidSpec");
    let missing: Vec<&str> = reasons
        .iter()
        .copied()
        .filter(|r| {
            !page.contains(&format!("### `{r}`\n")) && !page.contains(&format!("\n| `{r}` |"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/src/troubleshooting.md has no entry (a `### `Reason`` heading or a table row) for: {missing:?}"
    );
    assert!(reasons.len() > 60, "only {} reasons found", reasons.len());
}

/// The flags reference, generated from `autonodes`' command line.
fn flags_reference() -> String {
    let mut out = String::from(
        "# Controller flags\n\n\
         <!-- Generated from the command line (crates/autonodes/src/cli.rs and the argument structs \
         it names) by `cargo test -p autonodes --test it docs::`; AUTONODES_UPDATE_DOCS=1 rewrites it. -->\n\n\
         Every flag of the `autonodes` binary, with the environment variable that sets it too. \
         Durations are Go-style (`90s`, `10m`, `1h30m`). The chart sets the flags of `autonodes run` \
         from its [values](chart-values.md).\n",
    );
    let cli = autonodes::cli::Cli::command();
    for sub in cli.get_subcommands() {
        let name = sub.get_name();
        out.push_str(&format!("\n## `autonodes {name}`\n\n"));
        if let Some(about) = sub.get_about() {
            out.push_str(&format!("{}.\n\n", about.to_string().trim_end_matches('.')));
        }
        out.push_str("| flag | environment | default | meaning |\n|---|---|---|---|\n");
        for arg in sub.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let flag = match (arg.get_short(), arg.get_long()) {
                (Some(s), Some(l)) => format!("`-{s}`, `--{l}`"),
                (None, Some(l)) => format!("`--{l}`"),
                (Some(s), None) => format!("`-{s}`"),
                (None, None) => format!("`<{id}>`"),
            };
            let env = arg
                .get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_default();
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().to_string())
                .collect();
            let default = if arg.is_required_set() {
                "required".to_string()
            } else if defaults.is_empty() || defaults == [""] {
                String::new()
            } else {
                format!("`{}`", defaults.join(","))
            };
            let help = arg
                .get_long_help()
                .or(arg.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            let mut meaning = help.replace('\n', " ").trim_end_matches('.').to_string();
            let values: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| format!("`{}`", v.get_name()))
                .collect();
            if !values.is_empty() && values != ["`true`", "`false`"] {
                meaning.push_str(&format!(" ({})", values.join(", ")));
            }
            out.push_str(&format!(
                "| {flag} | {env} | {default} | {} |\n",
                meaning.replace('|', "\\|")
            ));
        }
    }
    out
}

#[test]
fn the_flags_reference_is_generated_from_the_command_line() {
    let generated = flags_reference();
    for flag in [
        "--launch-timeout",
        "--require-quota",
        "--tenant-kubeconfig",
        "--out",
    ] {
        assert!(
            generated.contains(flag),
            "{flag} missing from the generated reference"
        );
    }
    check_generated(&root().join("docs/src/reference/flags.md"), &generated);
}

/// A value the chart documents: its path and its `# --` comment.
#[derive(Debug)]
struct DocumentedValue {
    path: String,
    description: String,
}

/// The values of `values.yaml` with a `# --` comment right above them, in file order.
fn documented_values(text: &str) -> Vec<DocumentedValue> {
    let mut out = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix("# --") {
            pending = Some(rest.trim().to_string());
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix('#') {
            if let Some(p) = pending.as_mut() {
                p.push(' ');
                p.push_str(rest.trim());
            }
            continue;
        }
        if trimmed.starts_with('-') {
            pending = None;
            continue;
        }
        let Some((key, _)) = trimmed.split_once(':') else {
            continue;
        };
        if !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let path = stack
            .iter()
            .map(|(_, k)| k.as_str())
            .chain([key])
            .collect::<Vec<_>>()
            .join(".");
        if let Some(description) = pending.take() {
            out.push(DocumentedValue { path, description });
        }
        stack.push((indent, key.to_string()));
    }
    out
}

/// Every leaf of the values (a scalar, a list, an empty map), as a dotted path.
fn leaf_paths(value: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaf_paths(v, &path, out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

fn value_at<'a>(values: &'a serde_json::Value, path: &str) -> &'a serde_json::Value {
    path.split('.')
        .fold(values, |v, k| v.get(k).unwrap_or(&serde_json::Value::Null))
}

/// The chart's README, generated from `values.yaml`.
fn chart_readme(values_text: &str) -> String {
    let values: serde_json::Value = autonodes_core::yaml::from_str(values_text).unwrap();
    let documented = documented_values(values_text);
    let mut leaves = Vec::new();
    leaf_paths(&values, "", &mut leaves);
    let undocumented: Vec<&String> = leaves
        .iter()
        .filter(|leaf| {
            !documented
                .iter()
                .any(|d| **leaf == d.path || leaf.starts_with(&format!("{}.", d.path)))
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "values without a `# --` comment above them (or above a map holding them): {undocumented:?}"
    );
    let mut out = String::from(
        "# The autonodes Helm chart\n\n\
         <!-- Generated from values.yaml by `cargo test -p autonodes --test it docs::`; \
         AUTONODES_UPDATE_DOCS=1 rewrites it. Edit the comments in values.yaml instead. -->\n\n\
         Installs autonodes, which gives tenant clusters (vClusters and other kubeadm-style \
         clusters) worker nodes that are KubeVirt virtual machines: its CRDs, the controller \
         (two replicas with leader election), its RBAC, a metrics Service, and optionally a \
         ServiceMonitor, a PrometheusRule with the alerts and the Grafana dashboard.\n\n\
         ```sh\n\
         helm install autonodes charts/autonodes -n autonodes-system --create-namespace \\\n  \
         --set image.repository=registry.example.com/autonodes \\\n  \
         --set 'rbac.tenantNamespaces={tenant-a,tenant-b}'\n\
         ```\n\n\
         The book's installation chapter (`docs/src/install.md`) explains the rest: \
         registering host and tenant clusters, and the rights each needs.\n\n\
         ## Values\n\n\
         | key | default | description |\n|---|---|---|\n",
    );
    for d in &documented {
        let default = serde_json::to_string(value_at(&values, &d.path)).unwrap();
        out.push_str(&format!(
            "| `{}` | `{}` | {} |\n",
            d.path,
            default.replace('|', "\\|"),
            d.description.replace('|', "\\|")
        ));
    }
    out
}

#[test]
fn the_chart_readme_is_generated_from_values_yaml_and_documents_every_value() {
    let values = read(&root().join("charts/autonodes/values.yaml"));
    let generated = chart_readme(&values);
    for key in [
        "`replicaCount`",
        "`rbac.tenantNamespaces`",
        "`controller.launchTimeout`",
    ] {
        assert!(
            generated.contains(key),
            "{key} missing from the chart README"
        );
    }
    check_generated(&root().join("charts/autonodes/README.md"), &generated);
}

#[test]
fn an_undocumented_value_is_found() {
    let text = "# -- documented\na: 1\nb:\n  # -- inner\n  c: 2\n  d: 3\n";
    let documented: Vec<String> = documented_values(text)
        .into_iter()
        .map(|d| d.path)
        .collect();
    assert_eq!(documented, ["a", "b.c"]);
    let result = std::panic::catch_unwind(|| chart_readme(text));
    assert!(result.is_err(), "b.d has no comment and must be refused");
}

/// mdBook, from `AUTONODES_MDBOOK` or installed by `scripts/docs-tools.sh`.
fn mdbook() -> PathBuf {
    if let Some(p) = std::env::var_os("AUTONODES_MDBOOK") {
        return PathBuf::from(p);
    }
    let out = Command::new("bash")
        .arg(root().join("scripts/docs-tools.sh"))
        .output()
        .expect("running scripts/docs-tools.sh");
    assert!(
        out.status.success(),
        "scripts/docs-tools.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(
        stdout
            .lines()
            .last()
            .expect("docs-tools.sh printed no path")
            .trim(),
    )
}

#[test]
fn the_book_builds_with_mdbook_into_one_page_per_chapter() {
    let dest = tempfile::tempdir().unwrap();
    let out = Command::new(mdbook())
        .arg("build")
        .arg(root().join("docs"))
        .arg("--dest-dir")
        .arg(dest.path())
        .output()
        .expect("running mdbook");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "mdbook build failed:\n{log}");
    for page in [
        "getting-started.html",
        "troubleshooting.html",
        "reference/flags.html",
        "reference/chart-values.html",
    ] {
        assert!(dest.path().join(page).exists(), "{page} not built:\n{log}");
    }
    // The chart values page includes the generated chart README.
    let values = read(&dest.path().join("reference/chart-values.html"));
    assert!(
        values.contains("rbac.tenantNamespaces"),
        "the chart values were not included"
    );
    assert!(
        !log.contains("WARN") && !log.contains("ERROR"),
        "mdbook warned:\n{log}"
    );
}

#[test]
fn no_file_cites_a_design_document_outside_the_repository() {
    let mut offenders = Vec::new();
    let mut files = vec![root().join("README.md")];
    files.extend(files_under(
        vec![
            root().join("crates"),
            root().join("scripts"),
            root().join("docs"),
            root().join("charts"),
        ],
        &["rs", "sh", "md", "yaml"],
    ));
    // Spelled in parts, so this test does not find itself (nor does a grep of the tree).
    let needle = ["DES", "IGN", ".md"].concat();
    let section = ["DES", "IGN", " §"].concat();
    for f in files {
        let text = read(&f);
        if text.contains(&needle) || text.contains(&section) {
            offenders.push(f.display().to_string());
        }
    }
    assert!(
        offenders.is_empty(),
        "files citing a design document: {offenders:?}"
    );
}

#[test]
fn every_alert_has_a_runbook_url_into_a_section_of_the_operations_chapter() {
    const BASE: &str = "https://github.com/autonodes/autonodes/blob/main/docs/src/operations.md#";
    let rules: serde_json::Value = autonodes_core::yaml::from_str(&read(
        &root().join("charts/autonodes/alerts/autonodes.rules.yaml"),
    ))
    .unwrap();
    let page = parse_page(&read(&root().join("docs/src/operations.md")));
    let mut alerts = 0;
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            alerts += 1;
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_else(|| panic!("{name} has no runbook_url"));
            let anchor = url
                .strip_prefix(BASE)
                .unwrap_or_else(|| panic!("{name}: {url} is not a section of operations.md"));
            assert!(
                page.anchors.contains(anchor),
                "{name}: docs/src/operations.md has no section #{anchor}"
            );
            assert_eq!(
                anchor,
                name.to_lowercase(),
                "{name}: the runbook is its own section"
            );
        }
    }
    assert!(alerts >= 10, "only {alerts} alerts");
}

/// The metrics reference, generated from the metrics the controller registers: each one's
/// type, labels and HELP text.
fn metrics_reference() -> String {
    let metrics = autonodes::metrics::Metrics::new().expect("metrics register");
    let mut out = String::from(
        "# Metrics\n\n\
         <!-- Generated from the metrics the controller registers (crates/autonodes/src/metrics.rs) \
         by `cargo test -p autonodes --test it docs::`; AUTONODES_UPDATE_DOCS=1 rewrites it. -->\n\n\
         Every series `autonodes run` exports on `/metrics` (see [Operations](../operations.md) for \
         the endpoint, its authorization, the dashboard and the alerts). The meaning column is the \
         metric's HELP text, as Prometheus shows it. Besides these, the process's own series \
         (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`, \
         `process_start_time_seconds`, …) are exported unprefixed, as every Prometheus client library \
         exports them.\n\n\
         **Cost units.** `autonodes_nodetype_cost` and `autonodes_nodeclaims_cost` count in the \
         catalogue's own unit: a node type's `spec.cost`, or by default 10 per CPU + 2 per GiB of \
         memory + 10000 per unit of any other resource. autonodes compares and sums costs and never \
         converts them: if you write prices per hour in a currency, the metrics are per hour in that \
         currency.\n\n\
         | metric | type | labels | meaning |\n|---|---|---|---|\n",
    );
    for (desc, kind) in metrics.catalogue() {
        let labels: Vec<String> = desc
            .variable_labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect();
        out.push_str(&format!(
            "| `autonodes_{}` | {kind} | {} | {} |\n",
            desc.fq_name,
            labels.join(", "),
            desc.help.replace('|', "\\|")
        ));
    }
    out
}

#[test]
fn the_metrics_reference_is_generated_from_the_metrics_the_controller_registers() {
    let generated = metrics_reference();
    let metrics = autonodes::metrics::Metrics::new().expect("metrics register");
    let descs = metrics.descs();
    assert!(descs.len() >= 25, "{} metrics", descs.len());
    for d in &descs {
        let row = format!("| `autonodes_{}` |", d.fq_name);
        assert!(generated.contains(&row), "{row} missing");
    }
    assert!(generated.contains(
        "| `autonodes_nodeclaims_disrupted_total` | counter | `namespace`, `nodepool`, `reason` |"
    ));
    check_generated(&root().join("docs/src/reference/metrics.md"), &generated);
}

/// The facts the book and the READMEs state in several places, read from their one source.
struct Facts {
    /// `rust-version` of the workspace's Cargo.toml.
    rust_version: String,
    /// How many kinds the CRDs of the `autonodes.io` group define (`crds/`).
    autonodes_kinds: usize,
    /// The alerts of the rules file, in its order.
    alerts: Vec<String>,
    /// The architectures the image is built for (the Dockerfile's Rust targets).
    architectures: BTreeSet<String>,
}

impl Facts {
    fn read() -> Facts {
        let cargo = read(&root().join("Cargo.toml"));
        let rust_version = cargo
            .lines()
            .find_map(|l| l.trim().strip_prefix("rust-version = "))
            .expect("rust-version in Cargo.toml")
            .trim_matches('"')
            .to_string();
        let autonodes_kinds = files_under(vec![root().join("crds")], &["yaml"])
            .iter()
            .filter(|f| {
                f.file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.split_once('.'))
                    .is_some_and(|(_, group)| group == "autonodes.io.yaml")
            })
            .count();
        let alerts = read(&root().join("charts/autonodes/alerts/autonodes.rules.yaml"))
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- alert: "))
            .map(str::to_string)
            .collect();
        let architectures = read(&root().join("Dockerfile"))
            .split_whitespace()
            .filter_map(|w| w.split('/').find(|p| p.ends_with("-unknown-linux-gnu")))
            .filter_map(|t| t.split('-').next())
            .map(str::to_string)
            .collect();
        Facts {
            rust_version,
            autonodes_kinds,
            alerts,
            architectures,
        }
    }
}

const NUMBER_WORDS: [&str; 11] = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
];

/// Every statement in `pages` (path, text) that disagrees with `facts`: the Rust version
/// a line about Rust names (`1.89 or newer`), the count of `autonodes.io` kinds spelled
/// out, the alerts table of a page that has one, and the architectures a `- Linux …`
/// requirement names.
fn fact_disagreements(facts: &Facts, pages: &[(String, String)]) -> Vec<String> {
    let mut wrong = Vec::new();
    for (path, text) in pages {
        let mut table_alerts = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let at = format!("{path}:{}", n + 1);
            if line.contains("Rust") {
                for (i, _) in line.match_indices(" or newer") {
                    let version: String = line[..i]
                        .chars()
                        .rev()
                        .take_while(|c| c.is_ascii_digit() || *c == '.')
                        .collect::<Vec<char>>()
                        .into_iter()
                        .rev()
                        .collect();
                    if !version.is_empty() && version != facts.rust_version {
                        wrong.push(format!(
                            "{at}: Rust {version}, but Cargo.toml's rust-version is {}",
                            facts.rust_version
                        ));
                    }
                }
            }
            for (i, _) in line.match_indices(" `autonodes.io` kinds") {
                let word = line[..i].rsplit(' ').next().unwrap_or_default();
                if let Some(said) = NUMBER_WORDS.iter().position(|w| *w == word) {
                    if said != facts.autonodes_kinds {
                        wrong.push(format!(
                            "{at}: {word} `autonodes.io` kinds, but crds/ holds {}",
                            facts.autonodes_kinds
                        ));
                    }
                }
            }
            if let Some(rest) = line.strip_prefix("| [`Autonodes") {
                let name = rest.split('`').next().unwrap_or_default();
                table_alerts.push(format!("Autonodes{name}"));
            }
            if line.starts_with("- Linux") {
                for arch in ["x86_64", "arm64", "aarch64", "amd64"] {
                    let canonical = match arch {
                        "arm64" => "aarch64",
                        "amd64" => "x86_64",
                        a => a,
                    };
                    if line.contains(arch) && !facts.architectures.contains(canonical) {
                        wrong.push(format!(
                            "{at}: {arch}, but the image is built for {:?} only",
                            facts.architectures
                        ));
                    }
                }
            }
        }
        if !table_alerts.is_empty() && table_alerts != facts.alerts {
            wrong.push(format!(
                "{path}: its alerts table lists {table_alerts:?}, the rules file {:?}",
                facts.alerts
            ));
        }
    }
    wrong
}

#[test]
fn each_fact_the_book_states_in_several_places_agrees_with_its_one_source() {
    let facts = Facts::read();
    assert_eq!(
        facts.autonodes_kinds, 5,
        "NodeProvider, NodeType, NodeClaim, NodePool, NodeQuota"
    );
    assert!(facts.alerts.len() >= 10, "{:?}", facts.alerts);
    assert!(
        facts.architectures.contains("x86_64"),
        "{:?}",
        facts.architectures
    );
    let pages: Vec<(String, String)> = markdown_files()
        .into_iter()
        .map(|f| {
            let shown = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
            (shown, read(&f))
        })
        .collect();
    let wrong = fact_disagreements(&facts, &pages);
    assert!(
        wrong.is_empty(),
        "facts stated otherwise than their source:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_fact_stated_two_ways_is_found() {
    let facts = Facts {
        rust_version: "1.89".into(),
        autonodes_kinds: 5,
        alerts: vec!["AutonodesA".into(), "AutonodesB".into()],
        architectures: ["x86_64".to_string()].into_iter().collect(),
    };
    let agreeing = "- Linux (x86_64) with Rust stable (1.89 or newer)\n\
        get/list/watch on the five `autonodes.io` kinds\n\
        | [`AutonodesA`](#a) | x | warning |\n| [`AutonodesB`](#b) | y | warning |\n";
    assert!(fact_disagreements(&facts, &[("ok.md".into(), agreeing.into())]).is_empty());
    let disagreeing = "- Linux on x86_64 or arm64 with Rust (stable, 1.88 or newer)\n\
        get/list/watch on the four `autonodes.io` kinds\n\
        | [`AutonodesA`](#a) | x | warning |\n";
    let wrong = fact_disagreements(&facts, &[("bad.md".into(), disagreeing.into())]);
    assert_eq!(wrong.len(), 4, "{wrong:#?}");
    assert!(wrong[0].contains("Rust 1.88"), "{wrong:#?}");
}
