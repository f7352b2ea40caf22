//! `SHOW REPLICA STATUS` (`SHOW SLAVE STATUS`): the columns a monitoring tool reads,
//! computed from the applier's status and safe time. A promoted target answers as a
//! primary does: no row.
//!
//! | column | from |
//! | --- | --- |
//! | `Slave_IO_State` | what the intake does |
//! | `Slave_IO_Running` | `Yes` while a shipper streams a tablet; `No` when every tablet's intake is paused or stopped; else `Connecting` |
//! | `Slave_SQL_Running` | `No` once a tablet's apply stage stopped on an error, else `Yes` |
//! | `Seconds_Behind_Master` | the safe time's lag behind the wall clock, in whole seconds; `NULL` before it is initialized |
//! | `Gtid_IO_Pos`, `Gtid_Slave_Pos` | the visible gtid position (`@@gtid_current_pos`) |
//! | `Last_IO_Error`, `Last_SQL_Error` | the first tablet error of either kind |

use tidelog_applier::node::Applier;
use tidelog_applier::store::Role;

use crate::answer::{Cell, Col, SqlError};

const COLUMNS: &[(&str, bool)] = &[
    ("Slave_IO_State", false),
    ("Master_Host", false),
    ("Using_Gtid", false),
    ("Slave_IO_Running", false),
    ("Slave_SQL_Running", false),
    ("Last_Errno", true),
    ("Last_Error", false),
    ("Seconds_Behind_Master", true),
    ("Last_IO_Errno", true),
    ("Last_IO_Error", false),
    ("Last_SQL_Errno", true),
    ("Last_SQL_Error", false),
    ("Gtid_IO_Pos", false),
    ("Gtid_Slave_Pos", false),
    ("Slave_SQL_Running_State", false),
];

/// The columns, in MariaDB's order (a subset of them).
pub fn columns() -> Vec<Col> {
    COLUMNS
        .iter()
        .map(|(n, int)| if *int { Col::int(n) } else { Col::text(n) })
        .collect()
}

/// Whether a tablet state shows its intake stopped (not streaming and not about to).
fn intake_stopped(state: &str) -> bool {
    matches!(state, "paused" | "failed" | "needs_bootstrap")
}

/// The row (none on a promoted target). Status reads the store: off the runtime.
pub async fn rows(applier: &Applier) -> Result<Vec<Vec<Cell>>, SqlError> {
    let a = applier.clone();
    let (status, pos) = tokio::task::spawn_blocking(move || {
        let st = a.status()?;
        let pos = a.gtid_current_pos()?;
        Ok::<_, tidelog_applier::node::Error>((st, pos))
    })
    .await
    .map_err(|e| SqlError::new(1105, b"HY000", format!("internal: {e}")))?
    .map_err(SqlError::applier)?;
    if status.role == Role::Primary {
        return Ok(Vec::new());
    }
    let safe = applier.safe_time();
    let tablets = &status.tablets;
    let streaming = tablets.values().any(|t| t.state == "streaming");
    let io_running = if streaming {
        "Yes"
    } else if !tablets.is_empty() && tablets.values().all(|t| intake_stopped(t.state)) {
        "No"
    } else {
        "Connecting"
    };
    let sql_error = tablets
        .iter()
        .find_map(|(id, t)| {
            t.error
                .as_deref()
                .filter(|e| e.starts_with("apply stopped"))
                .map(|e| format!("tablet {id}: {e}"))
        })
        .or_else(|| {
            status
                .store
                .fault
                .clone()
                .filter(|_| !status.store.disk_full)
        });
    let io_error = tablets.iter().find_map(|(id, t)| {
        (t.error.is_some() && intake_stopped(t.state))
            .then(|| format!("tablet {id}: {}", t.error.as_deref().unwrap_or_default()))
    });
    let sql_running = if sql_error.is_some() { "No" } else { "Yes" };
    let io_state = match io_running {
        "Yes" => "Waiting for master to send event",
        "No" => "",
        _ => "Connecting to master",
    };
    let errno = |e: &Option<String>| Cell::Int(if e.is_some() { 1105 } else { 0 });
    let text = |e: &Option<String>| Cell::Text(e.clone().unwrap_or_default());
    let shippers: Vec<String> = {
        let mut s: Vec<String> = tablets.values().filter_map(|t| t.shipper.clone()).collect();
        s.sort();
        s.dedup();
        s
    };
    let pos = pos.to_string();
    Ok(vec![vec![
        Cell::Text(io_state.to_string()),
        Cell::Text(shippers.join(",")),
        Cell::Text("Slave_Pos".to_string()),
        Cell::Text(io_running.to_string()),
        Cell::Text(sql_running.to_string()),
        errno(&sql_error),
        text(&sql_error),
        match safe.lag_ms {
            Some(ms) => Cell::Int((ms / 1000) as i64),
            None => Cell::Null,
        },
        errno(&io_error),
        text(&io_error),
        errno(&sql_error),
        text(&sql_error),
        Cell::Text(pos.clone()),
        Cell::Text(pos),
        Cell::Text(
            if sql_running == "Yes" {
                "Slave has read all relay log; waiting for more updates"
            } else {
                ""
            }
            .to_string(),
        ),
    ]])
}
