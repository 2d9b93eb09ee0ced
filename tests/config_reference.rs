//! The configuration is written in three places: the structs in
//! `src/config/` (what fencegate reads), the reference table in
//! docs/operating.md (what an operator looks up) and the annotated sample
//! `config/fencegate.toml`. These tests fail when one of them has a table or
//! a field the others lack, when the sample's values are not the defaults,
//! and when operating.md names a default the code does not have.
//!
//! The structs' fields come from serde itself: a deserializer that answers
//! every question with a placeholder records the field list each
//! `#[derive(Deserialize)]` struct declares (renames included), and under
//! which table path it sits.

use fencegate::config::{ClusterConfig, Config};
use serde::Deserialize;
use serde::de::value::{Error, StrDeserializer};
use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// struct name -> (its fields, the table paths it is found at).
type Schema = BTreeMap<&'static str, (Vec<&'static str>, BTreeSet<String>)>;

/// A deserializer that records every struct serde asks it for.
#[derive(Clone)]
struct Recorder {
    path: String,
    seen: Rc<RefCell<Schema>>,
}

impl Recorder {
    fn at(&self, field: &str) -> Recorder {
        let path = match self.path.as_str() {
            "" => field.to_string(),
            p => format!("{p}.{field}"),
        };
        Recorder {
            path,
            seen: self.seen.clone(),
        }
    }
}

/// Every value that is not a struct: a placeholder its type accepts.
const PLACEHOLDER: &str = "127.0.0.1:1";

impl<'de> de::Deserializer<'de> for Recorder {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_str(PLACEHOLDER)
    }
    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_bool(false)
    }
    fn deserialize_u64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_u64(0)
    }
    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_some(self)
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, Error> {
        v.visit_newtype_struct(self)
    }
    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_seq(OneElement(Some(self)))
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        let mut seen = self.seen.borrow_mut();
        let entry = seen
            .entry(name)
            .or_insert_with(|| (fields.to_vec(), BTreeSet::new()));
        entry.1.insert(self.path.clone());
        drop(seen);
        v.visit_map(Fields {
            fields,
            next: 0,
            rec: self,
        })
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        let first: StrDeserializer<'_, Error> = variants[0].into_deserializer();
        v.visit_enum(first)
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u128 f32 f64 char str string bytes
        byte_buf unit unit_struct tuple tuple_struct map identifier ignored_any
    }
}

/// A sequence of one element, so that `Vec<Struct>` shows its struct.
struct OneElement(Option<Recorder>);

impl<'de> SeqAccess<'de> for OneElement {
    type Error = Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0.take().map(|r| seed.deserialize(r)).transpose()
    }
}

/// A struct's fields, each answered by a recorder one table deeper.
struct Fields {
    fields: &'static [&'static str],
    next: usize,
    rec: Recorder,
}

impl<'de> MapAccess<'de> for Fields {
    type Error = Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some(field) = self.fields.get(self.next) else {
            return Ok(None);
        };
        let key: StrDeserializer<'_, Error> = field.into_deserializer();
        seed.deserialize(key).map(Some)
    }
    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, Error> {
        let field = self.fields[self.next];
        self.next += 1;
        seed.deserialize(self.rec.at(field))
    }
}

/// table path -> its fields, as the structs declare them. A table found at
/// several paths (the `*_access` tables) is listed at each.
fn code_tables() -> BTreeMap<String, BTreeSet<String>> {
    let seen = Rc::new(RefCell::new(Schema::new()));
    let rec = Recorder {
        path: String::new(),
        seen: seen.clone(),
    };
    Config::deserialize(rec).expect("the placeholder config deserializes");
    let seen = seen.borrow();
    let paths: BTreeSet<&String> = seen.values().flat_map(|(_, paths)| paths).collect();
    let mut tables = BTreeMap::new();
    for (fields, at) in seen.values() {
        for path in at.iter().filter(|p| !p.is_empty()) {
            // A field that is itself a table is listed as that table.
            let values = fields
                .iter()
                .filter(|f| !paths.contains(&format!("{path}.{f}")));
            tables.insert(path.clone(), values.map(|f| f.to_string()).collect());
        }
    }
    tables
}

/// The struct each table path is an instance of, so that a sample may show
/// one of several tables of the same shape.
fn shapes(tables: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_shape: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    for (path, fields) in tables {
        by_shape
            .entry(fields.iter().cloned().collect())
            .or_default()
            .insert(path.clone());
    }
    tables
        .keys()
        .map(|p| {
            let same = by_shape
                .values()
                .find(|s| s.contains(p))
                .cloned()
                .unwrap_or_default();
            (p.clone(), same)
        })
        .collect()
}

fn read(path: &str) -> String {
    let full = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

/// `text` without anything in parentheses.
fn without_parentheses(text: &str) -> String {
    let (mut out, mut depth) = (String::new(), 0);
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// The backticked words of `text`.
fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The rows of operating.md's reference table: (tables, field cell).
fn reference_rows() -> Vec<(Vec<String>, String)> {
    let doc = read("docs/operating.md");
    let start = doc
        .find("| table | field | meaning |")
        .expect("operating.md has the reference table");
    let mut rows = Vec::new();
    let mut tables: Vec<String> = Vec::new();
    for line in doc[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
    {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (table_cell, field_cell) = (cells[1], cells[2]);
        if !table_cell.is_empty() {
            tables = backticked(table_cell)
                .iter()
                .map(|t| t.trim_matches(['[', ']']).to_string())
                .collect();
        }
        rows.push((tables.clone(), field_cell.to_string()));
    }
    rows
}

/// table path -> fields, as operating.md's reference lists them.
fn documented_tables() -> BTreeMap<String, BTreeSet<String>> {
    let mut tables: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (names, cell) in reference_rows() {
        for table in names {
            let fields = backticked(&without_parentheses(&cell));
            tables.entry(table).or_default().extend(fields);
        }
    }
    tables
}

/// table path -> fields the sample config shows, set or commented out.
fn sample_tables() -> BTreeMap<String, BTreeSet<String>> {
    let mut tables: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut table = String::new();
    for line in read("config/fencegate.toml").lines() {
        let bare = line.trim_start_matches(['#', ' ']);
        let bare = bare.split(" #").next().unwrap_or("").trim();
        if bare.starts_with('[') && bare.ends_with(']') {
            table = bare.trim_matches(['[', ']']).to_string();
            tables.entry(table.clone()).or_default();
        } else if let Some((key, _)) = bare.split_once('=') {
            let key = key.trim();
            if !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                tables
                    .entry(table.clone())
                    .or_default()
                    .insert(key.to_string());
            }
        }
    }
    tables.remove("");
    tables
}

fn differences(
    what: &str,
    want: &BTreeMap<String, BTreeSet<String>>,
    have: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (table, fields) in want {
        match have.get(table) {
            None => out.push(format!("{what} has no [{table}]")),
            Some(got) => {
                for f in fields.difference(got) {
                    out.push(format!("{what} lacks {table}.{f}"));
                }
                for f in got.difference(fields) {
                    out.push(format!(
                        "{what} names {table}.{f}, which the code does not read"
                    ));
                }
            }
        }
    }
    for table in have.keys().filter(|t| !want.contains_key(*t)) {
        out.push(format!(
            "{what} names [{table}], which the code does not read"
        ));
    }
    out
}

#[test]
fn operating_md_lists_every_table_and_field_the_code_reads() {
    let wrong = differences("docs/operating.md", &code_tables(), &documented_tables());
    assert!(
        wrong.is_empty(),
        "the reference and the structs differ:\n{}",
        wrong.join("\n")
    );
}

/// The sample shows each table's shape once: one `*_access` table stands
/// for all of them, and its fields may be spread over several of them.
#[test]
fn the_sample_config_shows_every_table_and_field_the_code_reads() {
    let code = code_tables();
    let sample = sample_tables();
    let mut merged: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut want: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, same) in shapes(&code) {
        let first = same.iter().next().cloned().unwrap_or(path.clone());
        want.insert(first.clone(), code[&path].clone());
        let shown = same.iter().filter_map(|p| sample.get(p)).flatten().cloned();
        if same.iter().any(|p| sample.contains_key(p)) {
            merged.entry(first).or_default().extend(shown);
        }
    }
    let mut wrong = differences("config/fencegate.toml", &want, &merged);
    let unknown = sample.keys().filter(|t| !code.contains_key(*t));
    wrong.extend(
        unknown.map(|t| format!("config/fencegate.toml names [{t}], which the code does not read")),
    );
    assert!(
        wrong.is_empty(),
        "the sample and the structs differ:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_sample_configs_values_are_the_defaults() {
    let sample = Config::parse(&read("config/fencegate.toml")).expect("the sample parses");
    assert_eq!(format!("{sample:#?}"), format!("{:#?}", Config::default()));
}

/// A default operating.md gives in parentheses, `` `field` (30000) ``, is
/// the one the struct's `Default` has.
#[test]
fn operating_md_states_the_defaults_the_code_has() {
    let d = Config::default();
    let defaults: BTreeMap<&str, String> = [
        ("server", format!("{:?}", d.server)),
        ("fence", format!("{:?}", d.fence)),
        ("backend", format!("{:?}", d.backend)),
        ("log", format!("{:?}", d.log)),
        ("locks", format!("{:?}", d.locks)),
        ("cluster", format!("{:?}", ClusterConfig::default())),
        ("sessions", format!("{:?}", d.sessions)),
    ]
    .into();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (tables, cell) in reference_rows() {
        let Some(debug) = tables.first().and_then(|t| defaults.get(t.as_str())) else {
            continue;
        };
        for (field, value) in stated_defaults(&cell) {
            checked += 1;
            let forms = [format!("{field}: {value}"), format!("{field}: {value:?}")];
            if !forms
                .iter()
                .any(|f| debug.contains(&format!("{f},")) || debug.contains(&format!("{f} }}")))
            {
                wrong.push(format!("{}.{field}: operating.md says {value}", tables[0]));
            }
        }
    }
    assert!(
        checked >= 10,
        "only {checked} defaults found: has the table's form changed?"
    );
    assert!(
        wrong.is_empty(),
        "defaults the code does not have:\n{}",
        wrong.join("\n")
    );
}

/// `` `field` (value) `` pairs of a cell whose value is a literal: a number,
/// `true`/`false`, or a backticked word.
fn stated_defaults(cell: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for part in cell.split("` (").skip(1).zip(cell.split("` (")) {
        let (after, before) = part;
        let Some(field) = before.rsplit('`').next() else {
            continue;
        };
        let Some(inner) = after.split(')').next() else {
            continue;
        };
        let value = inner.trim_matches('`');
        let literal = value.parse::<u64>().is_ok()
            || value == "true"
            || value == "false"
            || (inner.starts_with('`') && inner.ends_with('`') && !value.contains('`'));
        if literal {
            out.push((field.to_string(), value.to_string()));
        }
    }
    out
}
