#![allow(clippy::unwrap_used)]

use super::*;

fn stmt(text: &str) -> Statement {
    parse(text)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .statement
}

fn call(text: &str) -> (Func, Vec<Arg>) {
    match stmt(text) {
        Statement::Select(items) => match &items[0].item {
            Item::Call(f, a) => (*f, a.clone()),
            other => panic!("{text}: {other:?}"),
        },
        other => panic!("{text}: {other:?}"),
    }
}

#[test]
fn trx_status_forms_case_whitespace_and_comments() {
    let s = |v: &str| Arg::Str(v.to_string());
    for text in [
        "select trx_status('5:1')",
        "SELECT TRX_STATUS( '5:1' ) ;",
        "  Select\n\ttrx_status(\"5:1\")  -- comment\n",
        "/* hello */ SELECT trx_status('5:1') # trailing",
    ] {
        assert_eq!(call(text), (Func::TrxStatus, vec![s("5:1")]), "{text}");
    }
    assert_eq!(
        call("select trx_status('5:1', '0-1-2', 0.5)"),
        (
            Func::TrxStatus,
            vec![s("5:1"), s("0-1-2"), Arg::Num("0.5".into())]
        )
    );
    assert_eq!(
        call("select trx_status_json('5:1', NULL, 3)"),
        (
            Func::TrxStatusJson,
            vec![s("5:1"), Arg::Null, Arg::Num("3".into())]
        )
    );
    assert_eq!(
        call("SELECT master_gtid_wait('0-1-5,1-1-7', -1)"),
        (
            Func::MasterGtidWait,
            vec![s("0-1-5,1-1-7"), Arg::Num("-1".into())]
        )
    );
}

#[test]
fn strings_with_escapes_and_doubled_quotes() {
    assert_eq!(
        call(r"select trx_status('a\'b''c\\d\n')").1,
        vec![Arg::Str("a'b'c\\d\n".into())]
    );
    assert_eq!(
        call(r#"select trx_status("x""y")"#).1,
        vec![Arg::Str("x\"y".into())]
    );
    // A comment marker inside a string is part of the string.
    assert_eq!(
        call("select trx_status('-- #/*')").1,
        vec![Arg::Str("-- #/*".into())]
    );
}

#[test]
fn placeholders_are_numbered_in_order() {
    let p = parse("SELECT trx_status(?, ?, ?)").unwrap();
    assert_eq!(p.params, 3);
    assert_eq!(
        p.statement,
        Statement::Select(vec![SelectItem {
            item: Item::Call(
                Func::TrxStatus,
                vec![Arg::Param(0), Arg::Param(1), Arg::Param(2)]
            ),
            label: "trx_status(?, ?, ?)".into(),
        }])
    );
    assert_eq!(parse("select master_gtid_wait(?)").unwrap().params, 1);
    assert_eq!(parse("select trx_status('x')").unwrap().params, 0);
}

#[test]
fn variables_labels_and_aliases() {
    let Statement::Select(items) =
        stmt("SELECT @@max_allowed_packet, @@SESSION.wait_timeout AS wt, @@global.Version_Comment LIMIT 1")
    else {
        panic!()
    };
    let got: Vec<(Item, &str)> = items
        .iter()
        .map(|i| (i.item.clone(), i.label.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                Item::Var("max_allowed_packet".into()),
                "@@max_allowed_packet"
            ),
            (Item::Var("wait_timeout".into()), "wt"),
            (
                Item::Var("version_comment".into()),
                "@@global.Version_Comment"
            ),
        ]
    );
    assert_eq!(
        stmt("select 1"),
        Statement::Select(vec![SelectItem {
            item: Item::Literal(Arg::Num("1".into())),
            label: "1".into()
        }])
    );
    assert!(matches!(stmt("SELECT DATABASE()"), Statement::Select(_)));
}

#[test]
fn show_set_use() {
    assert_eq!(stmt("SHOW SLAVE STATUS"), Statement::ShowReplicaStatus);
    assert_eq!(stmt("show replica status;"), Statement::ShowReplicaStatus);
    assert_eq!(
        stmt("SHOW VARIABLES LIKE 'gtid%'"),
        Statement::ShowVariables(Some(Arg::Str("gtid%".into())))
    );
    assert_eq!(
        stmt("show session variables"),
        Statement::ShowVariables(None)
    );
    for text in [
        "SET NAMES utf8mb4",
        "SET NAMES 'utf8mb4' COLLATE 'utf8mb4_general_ci'",
        "SET autocommit=1",
        "SET SESSION sql_mode = 'STRICT_TRANS_TABLES', @@session.time_zone = '+00:00'",
        "set @@autocommit := 0",
        "SET character set utf8",
        "SET LOCAL net_write_timeout = 600",
    ] {
        assert_eq!(stmt(text), Statement::Set, "{text}");
    }
    assert_eq!(stmt("USE `my db`"), Statement::Use("my db".into()));
    assert_eq!(stmt("use tidelog"), Statement::Use("tidelog".into()));
    assert_eq!(stmt("COMMIT"), Statement::NoOp);
}

#[test]
fn everything_else_is_unsupported_and_names_what_is() {
    for text in [
        "INSERT INTO t VALUES (1)",
        "SELECT * FROM t",
        "SELECT trx_status('a') FROM dual",
        "SELECT sleep(1)",
        "SET GLOBAL read_only = 1",
        "SHOW TABLES",
        "SELECT trx_status('a'); SELECT 1",
        "SELECT trx_status('unterminated)",
        "SELECT trx_status(5:1)",
        "DROP TABLE x",
        "select trx_status(@@version)",
        "/* unterminated",
        "SELECT ✓",
    ] {
        match parse(text) {
            Err(e @ ParseError::Unsupported(_)) => {
                assert!(e.to_string().contains("trx_status("), "{text}: {e}")
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    assert_eq!(parse("  -- nothing\n"), Err(ParseError::Empty));
    assert_eq!(
        parse("select trx_status()"),
        Err(ParseError::ParamCount("trx_status"))
    );
    assert_eq!(
        parse("select master_gtid_wait('0-1-1', 1, 2)"),
        Err(ParseError::ParamCount("MASTER_GTID_WAIT"))
    );
}

#[test]
fn like_patterns() {
    assert!(like("gtid%", "gtid_current_pos"));
    assert!(like("GTID\\_%POS", "gtid_binlog_pos"));
    assert!(!like("gtid\\_x%", "gtid_binlog_pos"));
    assert!(like("ver_ion", "version"));
    assert!(like("%", ""));
    assert!(!like("a", ""));
    assert!(like(
        "%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%b",
        &"a".repeat(200).replace("aa", "ab")
    ));
    assert!(!like("%%%%%%%%%%%%%%%%%%%%%%%%%%%%%%c", &"a".repeat(200)));
}

proptest::proptest! {
    /// Any text: an answer or an error, never a panic.
    #[test]
    fn any_text_parses_or_errs(text in "\\PC{0,80}") {
        let _ = parse(&text);
    }

    #[test]
    fn any_sqlish_text_parses_or_errs(text in "[ sSeElLcCtT_rx(),'\"?@.0-9;`#*/\\\\-]{0,60}") {
        let _ = parse(&text);
    }
}
