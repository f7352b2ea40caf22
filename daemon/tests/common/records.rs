//! Records as `tidelog wal append` reads them (one JSON object a line), for tests that
//! write a source log by hand: single-tablet commits, intents, decisions, heartbeats.

pub fn write(t: &str, ht: u64, trx: &str, gtid: &str) -> String {
    format!(
        r#"{{"tablet":"{t}","kind":"write","ht":"{ht}","trx_id":"{trx}","gtid":"{gtid}","ops":[{{"key":"w{ht}","value":"v"}}]}}"#
    )
}
pub fn intent(t: &str, ht: u64, txn: u32, trx: &str) -> String {
    format!(
        r#"{{"tablet":"{t}","kind":"intent","ht":"{ht}","txn":"{txn:032x}","trx_id":"{trx}","ops":[{{"key":"i{txn}{t}","value":"v"}}]}}"#
    )
}
pub fn commit(t: &str, ht: u64, txn: u32, parts: &[&str], trx: &str, gtid: &str) -> String {
    let p: Vec<String> = parts.iter().map(|p| format!("\"{p}\"")).collect();
    format!(
        r#"{{"tablet":"{t}","kind":"commit","ht":"{ht}","txn":"{txn:032x}","participants":[{}],"trx_id":"{trx}","gtid":"{gtid}"}}"#,
        p.join(",")
    )
}
pub fn abort(t: &str, ht: u64, txn: u32, trx: &str) -> String {
    format!(r#"{{"tablet":"{t}","kind":"abort","ht":"{ht}","txn":"{txn:032x}","trx_id":"{trx}"}}"#)
}
pub fn heartbeat(t: &str, ht: u64) -> String {
    format!(r#"{{"tablet":"{t}","kind":"heartbeat","ht":"{ht}"}}"#)
}
