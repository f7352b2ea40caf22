//! `[sql]` turned into the SQL endpoint's options: the password file read (refused when
//! group or others can read it) and TLS built from `[tls]`'s certificate and key — the same
//! checks at start and in `tidelog apply --check`. The keys themselves are parsed by
//! `tidelog_config::SqlConfig`.

use std::sync::Arc;

use anyhow::{Context, Result};
use tidelog_config::{SqlConfig, SqlTls};
use tidelog_net::tls::TlsMaterial;
use tidelog_sql::{Password, SqlOptions};

/// The endpoint's options: reads the password file and builds the TLS configuration
/// from `tls` (`[tls]`'s certificate and key). Errors name the key.
pub fn sql_options(sql: &SqlConfig, tls: &TlsMaterial) -> Result<SqlOptions> {
    let password = Password::read(&sql.password_file).context("key \"sql.password-file\"")?;
    let tls_config = match sql.tls {
        SqlTls::Off => None,
        SqlTls::Optional | SqlTls::Required => Some(Arc::new(
            tidelog_net::tls::server_crypto_password_clients(tls)
                .context("key \"sql.tls\": [tls] cert and key")?,
        )),
    };
    Ok(SqlOptions {
        listen: sql.listen,
        user: sql.user.clone(),
        password,
        tls: tls_config,
        tls_required: sql.tls == SqlTls::Required,
        max_connections: sql.max_connections,
        idle_timeout: sql.idle_timeout,
    })
}
