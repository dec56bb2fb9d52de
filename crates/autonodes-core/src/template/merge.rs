//! The strategic merge of VM templates (lists merged by key where Kubernetes does, `$patch`
//! directives) and the JSON object helpers the template code writes with.

use serde_json::{Map, Value};

/// Lists that merge element by element, keyed by a field, instead of being replaced:
/// `(path of the list, path of the key inside each element)`.
pub(crate) const MERGE_KEYS: &[(&[&str], &[&str])] = &[
    (
        &["spec", "template", "spec", "domain", "devices", "disks"],
        &["name"],
    ),
    (
        &[
            "spec",
            "template",
            "spec",
            "domain",
            "devices",
            "interfaces",
        ],
        &["name"],
    ),
    (&["spec", "template", "spec", "networks"], &["name"]),
    (&["spec", "template", "spec", "volumes"], &["name"]),
    (&["spec", "dataVolumeTemplates"], &["metadata", "name"]),
];

/// The directive key of a strategic merge patch (`$patch: delete | replace | merge`).
pub(crate) const PATCH_DIRECTIVE: &str = "$patch";

/// Why a strategic merge failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// An element of a list merged by key lacks the key.
    #[error("{path}[{index}]: element has no merge key {key}")]
    MissingMergeKey {
        /// Dotted path of the list.
        path: String,
        /// Index of the element in the patch list.
        index: usize,
        /// The dotted key path (`name`, `metadata.name`).
        key: String,
    },
    /// An element of a list merged by key is not an object.
    #[error("{path}[{index}]: element of a list merged by {key} must be an object")]
    NotAnObject {
        /// Dotted path of the list.
        path: String,
        /// Index of the element in the patch list.
        index: usize,
        /// The dotted key path.
        key: String,
    },
    /// A `$patch` directive with an unknown value.
    #[error("{path}: unknown $patch directive {value:?} (expected delete, replace or merge)")]
    UnknownDirective {
        /// Dotted path of the object with the directive.
        path: String,
        /// The directive value.
        value: String,
    },
}

// ---------------------------------------------------------------------------------------
// Strategic merge
// ---------------------------------------------------------------------------------------

/// Strategic merge of `patch` over `base`, returning the result:
/// - objects merge key by key; a `null` value deletes the key;
/// - lists listed in [`MERGE_KEYS`] merge element by element on their key (elements of the
///   patch with a key found in the base are merged into that element, others are appended;
///   an element with `$patch: delete` removes the base element with its key);
/// - every other list, and every scalar, is replaced by the patch;
/// - an object with `$patch: replace` replaces the base object instead of merging.
///
/// An empty patch object leaves the base unchanged. Never panics, whatever the input.
pub fn strategic_merge(base: &Value, patch: &Value) -> Result<Value, MergeError> {
    let mut out = base.clone();
    merge_into(&mut out, patch)?;
    Ok(out)
}

/// In-place form of [`strategic_merge`].
pub(crate) fn merge_into(base: &mut Value, patch: &Value) -> Result<(), MergeError> {
    let mut path = Vec::new();
    merge_value(base, patch, &mut path)
}

fn dotted(path: &[&str]) -> String {
    if path.is_empty() {
        "<root>".to_string()
    } else {
        path.join(".")
    }
}

fn merge_key_for(path: &[&str]) -> Option<&'static [&'static str]> {
    MERGE_KEYS
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, key)| *key)
}

fn lookup<'v>(value: &'v Value, key_path: &[&str]) -> Option<&'v Value> {
    key_path.iter().try_fold(value, |v, k| v.get(k))
}

fn directive(obj: &Map<String, Value>) -> Option<&Value> {
    obj.get(PATCH_DIRECTIVE)
}

/// A copy of a patch value for insertion: `null` map values and `$patch` directives removed.
fn cleaned(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, v)| !v.is_null() && k.as_str() != PATCH_DIRECTIVE)
                .map(|(k, v)| (k.clone(), cleaned(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(cleaned).collect()),
        other => other.clone(),
    }
}

fn merge_value<'p>(
    base: &mut Value,
    patch: &'p Value,
    path: &mut Vec<&'p str>,
) -> Result<(), MergeError> {
    match patch {
        Value::Object(pmap) => {
            match directive(pmap) {
                None => {}
                Some(Value::String(d)) if d == "merge" => {}
                Some(Value::String(d)) if d == "replace" => {
                    *base = cleaned(patch);
                    return Ok(());
                }
                Some(other) => {
                    return Err(MergeError::UnknownDirective {
                        path: dotted(path),
                        value: other
                            .as_str()
                            .map_or_else(|| other.to_string(), str::to_string),
                    })
                }
            }
            let Value::Object(bmap) = base else {
                *base = cleaned(patch);
                return Ok(());
            };
            for (k, pv) in pmap {
                if k == PATCH_DIRECTIVE {
                    continue;
                }
                if pv.is_null() {
                    bmap.remove(k);
                    continue;
                }
                match bmap.get_mut(k) {
                    Some(bv) => {
                        path.push(k);
                        let r = merge_value(bv, pv, path);
                        path.pop();
                        r?;
                    }
                    None => {
                        bmap.insert(k.clone(), cleaned(pv));
                    }
                }
            }
            Ok(())
        }
        Value::Array(items) => {
            match (merge_key_for(path), base) {
                (Some(key), Value::Array(base_items)) => {
                    merge_keyed_list(base_items, items, key, path)
                }
                (Some(key), base) => {
                    // Nothing to merge into: validate the directives, then take the patch.
                    let mut fresh = Vec::new();
                    merge_keyed_list(&mut fresh, items, key, path)?;
                    *base = Value::Array(fresh);
                    Ok(())
                }
                (None, base) => {
                    *base = cleaned(patch);
                    Ok(())
                }
            }
        }
        Value::Null => {
            *base = Value::Null;
            Ok(())
        }
        scalar => {
            *base = scalar.clone();
            Ok(())
        }
    }
}

fn merge_keyed_list<'p>(
    base: &mut Vec<Value>,
    patch: &'p [Value],
    key: &[&str],
    path: &mut Vec<&'p str>,
) -> Result<(), MergeError> {
    for (index, item) in patch.iter().enumerate() {
        let Value::Object(obj) = item else {
            return Err(MergeError::NotAnObject {
                path: dotted(path),
                index,
                key: key.join("."),
            });
        };
        let Some(wanted) = lookup(item, key).filter(|v| !v.is_null()) else {
            return Err(MergeError::MissingMergeKey {
                path: dotted(path),
                index,
                key: key.join("."),
            });
        };
        let found = base
            .iter()
            .position(|b| lookup(b, key).is_some_and(|k| k == wanted));
        if matches!(directive(obj), Some(Value::String(d)) if d == "delete") {
            base.retain(|b| lookup(b, key).is_none_or(|k| k != wanted));
            continue;
        }
        match found {
            Some(i) => {
                path.push("[]");
                let r = merge_value(&mut base[i], item, path);
                path.pop();
                r?;
            }
            None => {
                // Validate directives nested in the new element, then append it.
                if let Some(Value::String(d)) = directive(obj) {
                    if d != "replace" && d != "merge" {
                        return Err(MergeError::UnknownDirective {
                            path: format!("{}[{index}]", dotted(path)),
                            value: d.clone(),
                        });
                    }
                }
                base.push(cleaned(item));
            }
        }
    }
    Ok(())
}

/// The object at the JSON `pointer` in `root`, made (with its parents) where missing or
/// `null`; `None` when something on the way is not an object. What the property devices
/// ([`super::networks`], [`super::placement`]) write into a template goes through it.
pub(crate) fn ensure_object<'v>(
    root: &'v mut Value,
    pointer: &str,
) -> Option<&'v mut Map<String, Value>> {
    let mut at = root;
    for part in pointer.split('/').filter(|p| !p.is_empty()) {
        if at.is_null() {
            *at = Value::Object(Map::new());
        }
        at = at.as_object_mut()?.entry(part).or_insert(Value::Null);
    }
    if at.is_null() {
        *at = Value::Object(Map::new());
    }
    at.as_object_mut()
}
