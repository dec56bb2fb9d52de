//! YAML in and out, with the one YAML library of the tree (`serde-saphyr`, which kube's
//! client uses too). Dynamic documents are [`serde_json::Value`]s.
//!
//! Reading is made for text that users and tenants write: the library's budgets bound
//! depth, nodes and alias expansion; duplicate keys are refused; error messages carry a
//! position but never a snippet of the text (it may hold credentials); numbers with a
//! leading zero (`0644`) stay strings, as written, instead of turning into decimals; only
//! `true` and `false` are booleans (YAML 1.2: `yes`, `on`, `y` stay strings, as with
//! serde_yaml before); merge keys (`<<`) are applied, as kubectl's YAML reader applies them.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A YAML document that could not be read.
pub type Error = serde_saphyr::Error;

/// A value that could not be written as YAML.
pub(crate) type WriteError = serde_saphyr::SerializeError;

/// The options every read uses (see the module documentation).
fn options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.with_snippet = false;
    options.leading_zero_numbers_as_strings = true;
    options.strict_booleans = true;
    options
}

/// Reads one YAML document.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    serde_saphyr::from_str_with_options(text, options())
}

/// Reads one YAML document; an error names the field path where it failed
/// (`spec.desiredCapacity.cpu: invalid type: …`) as well as the position.
pub fn from_str_with_path<T: DeserializeOwned>(text: &str) -> Result<T, Error> {
    serde_saphyr::with_deserializer_from_str_with_options(text, options(), |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path.is_empty() || path == "." {
                inner
            } else {
                <Error as serde::de::Error>::custom(format!("{path}: {inner}"))
            }
        })
    })
}

/// Reads one YAML document from bytes (UTF-8).
pub(crate) fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    serde_saphyr::from_slice_with_options(bytes, options())
}

/// Reads every document of a `---`-separated YAML stream (empty documents skipped).
pub fn from_multiple<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, Error> {
    serde_saphyr::from_multiple_with_options(text, options())
}

/// Writes `value` as one YAML document.
pub fn to_string<T: Serialize>(value: &T) -> Result<String, WriteError> {
    serde_saphyr::to_string(value)
}

/// ` (line L, column C)` where the error has a position, else nothing.
pub fn position(error: &Error) -> String {
    error
        .location()
        .map(|l| format!(" (line {}, column {})", l.line(), l.column()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn a_document_reads_into_json_values_with_octal_looking_numbers_and_yes_kept_as_written() {
        let v: Value =
            from_str("a: 1\nb: x\nmode: 0644\nlist: [true, ~, yes, y, on]\n").expect("parses");
        assert_eq!(
            v,
            json!({"a": 1, "b": "x", "mode": "0644", "list": [true, null, "yes", "y", "on"]})
        );
    }

    #[test]
    fn duplicate_keys_are_refused_with_a_position_and_without_quoting_the_text() {
        let e = from_str::<Value>("token: secret-1\ntoken: secret-2\n").expect_err("duplicate");
        assert_eq!(position(&e), " (line 2, column 1)");
        assert!(!e.to_string().contains("secret"), "{e}");
        let e = from_str::<Value>("a: [secret\n").expect_err("unclosed");
        assert!(!e.to_string().contains("secret"), "{e}");
    }

    #[test]
    fn a_typed_read_names_the_field_path_and_the_position_of_a_wrong_value() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Outer {
            spec: Inner,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Inner {
            count: u32,
        }
        let e = from_str_with_path::<Outer>("spec:\n  count: [1]\n").expect_err("bad");
        let shown = e.to_string();
        assert!(shown.starts_with("spec.count: "), "{shown}");
        assert!(shown.contains("line 2"), "{shown}");
    }

    #[test]
    fn alias_bombs_are_refused_by_the_budget() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        assert!(from_str::<Value>(&text).is_err());
    }

    #[test]
    fn a_stream_reads_every_document_and_a_value_writes_back_the_same() {
        let docs: Vec<Value> = from_multiple("a: 1\n---\nb: [x]\n").expect("parses");
        assert_eq!(docs, vec![json!({"a": 1}), json!({"b": ["x"]})]);
        let text = to_string(&docs[1]).expect("writes");
        assert_eq!(from_str::<Value>(&text).expect("reads back"), docs[1]);
    }
}
