//! `fencegate fences export` and `import`: every fence of one fence table, as
//! JSON lines, into another. They move a single node's fences into etcd
//! (and back) when a deployment grows into replicas (docs/cluster.md,
//! "Moving a node over").
//!
//! Import only ever raises (`max(recorded, imported)`), so importing the
//! same file twice, or an older export after a newer one, changes nothing
//! that matters: the last import of a stopped node's final state brings the
//! target up to it, whatever came before.

use crate::config::Config;
use crate::fence::cluster::Cluster;
use crate::fence::table::{FenceRecord, FenceTable, RedbTable};
use serde::Deserialize;
use std::io::{BufRead, Write};
use std::sync::Arc;

/// Fences read per page.
const PAGE: usize = 1000;

/// The fence table `cfg` names: etcd with `[cluster]`, else `fences.redb` in the
/// data directory (which only one process may open: stop the node first).
pub async fn open_table(cfg: &Config) -> Result<Arc<dyn FenceTable>, String> {
    if let Some(c) = &cfg.cluster {
        return Ok(Cluster::open_table(c).await?);
    }
    let path = cfg.server.data_dir.join("fences.redb");
    if !path.exists() {
        return Err(format!("{} does not exist", path.display()));
    }
    let store = RedbTable::open(&path).map_err(|e| {
        format!("{e} (a running fencegate holds its fence table: stop it, or export with --admin)")
    })?;
    Ok(Arc::new(store))
}

/// Writes every fence of `store` to `out`, one JSON object per line.
/// Returns how many.
pub async fn export(store: &dyn FenceTable, out: &mut dyn Write) -> Result<u64, String> {
    let mut after: Option<String> = None;
    let mut n = 0;
    loop {
        let page = store
            .list("", after.as_deref(), PAGE)
            .await
            .map_err(|e| e.to_string())?;
        n += write_lines(&page, out)?;
        match page.last() {
            Some(last) if page.len() == PAGE => after = Some(last.resource.clone()),
            _ => return Ok(n),
        }
    }
}

/// Writes `records` to `out`, one JSON object per line (the form `import`
/// reads). Returns how many.
pub fn write_lines(records: &[FenceRecord], out: &mut dyn Write) -> Result<u64, String> {
    for r in records {
        let line = serde_json::to_string(r).map_err(|e| e.to_string())?;
        writeln!(out, "{line}").map_err(|e| e.to_string())?;
    }
    Ok(records.len() as u64)
}

#[derive(Deserialize)]
struct Line {
    resource: String,
    highest: u64,
}

/// What an import did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Imported {
    /// Lines read.
    pub fences: u64,
    /// Fences the target held above the imported token already.
    pub already: u64,
}

/// Raises `store` to every fence in `input` (JSON lines, as `export`
/// writes them). A line that does not parse stops the import, naming it;
/// what came before it stays imported.
pub async fn import(store: &dyn FenceTable, input: &mut dyn BufRead) -> Result<Imported, String> {
    let mut done = Imported::default();
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|e| e.to_string())?;
        if line.trim().is_empty() {
            continue;
        }
        let Line { resource, highest } = serde_json::from_str(&line).map_err(|e| {
            format!(
                "line {}: {e} (expected {{\"resource\": …, \"highest\": N}})",
                i + 1
            )
        })?;
        let now = store
            .raise(&resource, highest)
            .await
            .map_err(|e| format!("line {}: {e}", i + 1))?;
        done.fences += 1;
        if now > highest {
            done.already += 1;
        }
    }
    Ok(done)
}

/// One page of fences the admin API of a running node returns (for
/// `export --admin`).
#[derive(Deserialize)]
pub struct Page {
    pub fences: Vec<FenceRecord>,
    pub next_after: Option<String>,
}

/// One resource's fence, as `fencegate fences highest` prints it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FenceRecordOut {
    pub resource: String,
    pub highest: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn export_then_import_moves_every_fence_and_never_lowers_one() {
        let dir = tempfile::tempdir().unwrap();
        let from = RedbTable::open(&dir.path().join("a.redb")).unwrap();
        for i in 0..(PAGE as u64 + 5) {
            from.raise(&format!("b/k{i:05}"), 10 + i).await.unwrap();
        }
        let mut out = Vec::new();
        assert_eq!(export(&from, &mut out).await.unwrap(), PAGE as u64 + 5);

        let to = RedbTable::open(&dir.path().join("b.redb")).unwrap();
        to.raise("b/k00000", 99).await.unwrap();
        let done = import(&to, &mut &out[..]).await.unwrap();
        assert_eq!(done.fences, PAGE as u64 + 5);
        assert_eq!(done.already, 1);
        assert_eq!(to.get("b/k00000").await.unwrap(), Some(99), "never lowered");
        assert_eq!(to.get("b/k01004").await.unwrap(), Some(10 + 1004));

        let bad = b"{\"resource\":\"x\",\"highest\":1}\nnot json\n";
        let e = import(&to, &mut &bad[..]).await.unwrap_err();
        assert!(e.starts_with("line 2"), "{e}");
        assert_eq!(to.get("x").await.unwrap(), Some(1));
    }
}
