# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_tidelog_global_optspecs
    string join \n log-level= h/help V/version
end

function __fish_tidelog_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_tidelog_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_tidelog_using_subcommand
    set -l cmd (__fish_tidelog_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c tidelog -n "__fish_tidelog_needs_command" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_needs_command" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_needs_command" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_needs_command" -f -a "apply" -d 'Run the applier daemon (target side): QUIC intake, apply, admin API'
complete -c tidelog -n "__fish_tidelog_needs_command" -f -a "ship" -d 'Run the shipper daemon (source side): tail the WALs and ship them'
complete -c tidelog -n "__fish_tidelog_needs_command" -f -a "demo" -d 'Everything on one machine: applier, shipper and a bank workload, with consistency checks'
complete -c tidelog -n "__fish_tidelog_needs_command" -f -a "wal" -d 'Inspect, verify and write tablet WALs (`dump`, `append`, `check`)'
complete -c tidelog -n "__fish_tidelog_needs_command" -f -a "certs" -d 'Create the CA and the mTLS certificates of both daemons'
complete -c tidelog -n "__fish_tidelog_needs_command" -f -a "ctl" -d 'Talk to a running daemon through its admin socket'
complete -c tidelog -n "__fish_tidelog_needs_command" -f -a "generate" -d 'Write the man pages or the shell completions (for packaging)'
complete -c tidelog -n "__fish_tidelog_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tidelog -n "__fish_tidelog_using_subcommand apply" -l config -d 'The daemon\'s TOML configuration file' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand apply" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand apply" -l check -d 'Parse and validate the configuration, load the TLS files it names and build the TLS configuration from them (and, for `ship`, probe io_uring as `io-engine` asks), then exit: everything start-up does before its first side effect'
complete -c tidelog -n "__fish_tidelog_using_subcommand apply" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand apply" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand ship" -l config -d 'The daemon\'s TOML configuration file' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand ship" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ship" -l check -d 'Parse and validate the configuration, load the TLS files it names and build the TLS configuration from them (and, for `ship`, probe io_uring as `io-engine` asks), then exit: everything start-up does before its first side effect'
complete -c tidelog -n "__fish_tidelog_using_subcommand ship" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand ship" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand demo" -l duration -d 'How long the bank workload runs' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand demo" -l tablets -d 'Tablets (source shards)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand demo" -l rate -d 'Offered load in transactions per second (0 = as fast as the machine goes)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand demo" -l accounts -d 'Bank accounts' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand demo" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand demo" -l keep -d 'Keep the demo directory (configs, WALs, store, logs) instead of removing it'
complete -c tidelog -n "__fish_tidelog_using_subcommand demo" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand demo" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and not __fish_seen_subcommand_from dump append check help" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and not __fish_seen_subcommand_from dump append check help" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and not __fish_seen_subcommand_from dump append check help" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and not __fish_seen_subcommand_from dump append check help" -f -a "dump" -d 'Print records as JSON lines on stdout'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and not __fish_seen_subcommand_from dump append check help" -f -a "append" -d 'Append records given as JSON lines on stdin, one commit per line'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and not __fish_seen_subcommand_from dump append check help" -f -a "check" -d 'Verify every segment and record; print a summary line per tablet'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and not __fish_seen_subcommand_from dump append check help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from dump" -l dir -d 'The WAL directory (one sub-directory per tablet)' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from dump" -l tablet -d 'Only this tablet' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from dump" -l from -d 'Start at this record position (decimal or 0x hex); needs --tablet' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from dump" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from dump" -l written -d 'Read up to written_pos (committed, maybe not yet durable) instead of durable_pos'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from dump" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from dump" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from append" -l dir -d 'The WAL directory (created if missing)' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from append" -l tablet -d 'The tablet of lines without a "tablet" field; a line naming another tablet is an error. Without it every line must name its tablet' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from append" -l sync -d 'When each line\'s commit becomes durable; everything is synced before exit anyway' -r -f -a "always\t'msync before each commit returns'
batch\t'Group commit'
none\t'No sync per commit'"
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from append" -l segment-size -d 'Size of new segment files: bytes, or with a unit (KiB, MiB, GiB; KB, MB, GB)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from append" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from append" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from append" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from check" -l dir -d 'The WAL directory (one sub-directory per tablet)' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from check" -l tablet -d 'Only this tablet' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from check" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from check" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from check" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from help" -f -a "dump" -d 'Print records as JSON lines on stdout'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from help" -f -a "append" -d 'Append records given as JSON lines on stdin, one commit per line'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from help" -f -a "check" -d 'Verify every segment and record; print a summary line per tablet'
complete -c tidelog -n "__fish_tidelog_using_subcommand wal; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tidelog -n "__fish_tidelog_using_subcommand certs; and not __fish_seen_subcommand_from init help" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand certs; and not __fish_seen_subcommand_from init help" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand certs; and not __fish_seen_subcommand_from init help" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand certs; and not __fish_seen_subcommand_from init help" -f -a "init" -d 'Write ca.pem ca.key applier.pem applier.key shipper.pem shipper.key into DIR (keys mode 0600). The applier certificate names localhost, 127.0.0.1 and every --san'
complete -c tidelog -n "__fish_tidelog_using_subcommand certs; and not __fish_seen_subcommand_from init help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tidelog -n "__fish_tidelog_using_subcommand certs; and __fish_seen_subcommand_from init" -l dir -d 'Output directory (created if missing)' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand certs; and __fish_seen_subcommand_from init" -l san -d 'Another name for the applier certificate: an IP address or a DNS name. Repeatable' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand certs; and __fish_seen_subcommand_from init" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand certs; and __fish_seen_subcommand_from init" -l force -d 'Replace existing files'
complete -c tidelog -n "__fish_tidelog_using_subcommand certs; and __fish_seen_subcommand_from init" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand certs; and __fish_seen_subcommand_from init" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand certs; and __fish_seen_subcommand_from help" -f -a "init" -d 'Write ca.pem ca.key applier.pem applier.key shipper.pem shipper.key into DIR (keys mode 0600). The applier certificate names localhost, 127.0.0.1 and every --san'
complete -c tidelog -n "__fish_tidelog_using_subcommand certs; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -l socket -d 'The daemon\'s admin socket' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -l timeout -d 'Give up on an answer after this long (added to `--wait` for `trx-status`)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -l json -d 'Print the API\'s JSON answer (pretty on a terminal, one line otherwise)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -l wide -d 'Every field of `status` and `safe-time`, not only the summary and compact table'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -f -a "status" -d 'Role, safe time and per-tablet positions and state'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -f -a "safe-time" -d 'Global and per-tablet safe time and lag'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -f -a "get" -d 'Read one key (consistent at safe time by default)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -f -a "scan" -d 'Read the keys starting with PREFIX'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -f -a "trx-status" -d 'Did transaction TRX (`connect_id:counter`) commit?'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -f -a "binlog" -d 'Commits in commit order'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -f -a "promote" -d 'Promote the target to primary at a clean cut (irreversible: needs --yes, or the word `promote` typed on a terminal)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -f -a "pause" -d 'Stop shipping (shipper) or intake (applier), for all tablets or one'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -f -a "resume" -d 'Undo `pause`'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -f -a "metrics" -d 'Prometheus metrics, as is (with --json: parsed, one object per family)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and not __fish_seen_subcommand_from status safe-time get scan trx-status binlog promote pause resume metrics help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from status" -l socket -d 'The daemon\'s admin socket' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from status" -l timeout -d 'Give up on an answer after this long (added to `--wait` for `trx-status`)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from status" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from status" -l json -d 'Print the API\'s JSON answer (pretty on a terminal, one line otherwise)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from status" -l wide -d 'Every field of `status` and `safe-time`, not only the summary and compact table'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from status" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from status" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from safe-time" -l socket -d 'The daemon\'s admin socket' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from safe-time" -l timeout -d 'Give up on an answer after this long (added to `--wait` for `trx-status`)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from safe-time" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from safe-time" -l json -d 'Print the API\'s JSON answer (pretty on a terminal, one line otherwise)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from safe-time" -l wide -d 'Every field of `status` and `safe-time`, not only the summary and compact table'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from safe-time" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from safe-time" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from get" -l at -d 'Read at this hybrid time (≤ safe time, within retention)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from get" -l socket -d 'The daemon\'s admin socket' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from get" -l timeout -d 'Give up on an answer after this long (added to `--wait` for `trx-status`)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from get" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from get" -l latest -d 'Read the newest applied data (may show partial transactions)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from get" -l json -d 'Print the API\'s JSON answer (pretty on a terminal, one line otherwise)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from get" -l wide -d 'Every field of `status` and `safe-time`, not only the summary and compact table'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from get" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from get" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from scan" -l at -d 'Read at this hybrid time' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from scan" -l limit -d 'At most this many items' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from scan" -l socket -d 'The daemon\'s admin socket' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from scan" -l timeout -d 'Give up on an answer after this long (added to `--wait` for `trx-status`)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from scan" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from scan" -l latest -d 'Read the newest applied data'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from scan" -l json -d 'Print the API\'s JSON answer (pretty on a terminal, one line otherwise)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from scan" -l wide -d 'Every field of `status` and `safe-time`, not only the summary and compact table'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from scan" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from scan" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from trx-status" -l gtid -d 'The gtid the client saw for its commit; the target waits for it to become visible' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from trx-status" -l wait -d 'How long the target may wait for --gtid (e.g. 5s)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from trx-status" -l socket -d 'The daemon\'s admin socket' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from trx-status" -l timeout -d 'Give up on an answer after this long (added to `--wait` for `trx-status`)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from trx-status" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from trx-status" -l json -d 'Print the API\'s JSON answer (pretty on a terminal, one line otherwise)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from trx-status" -l wide -d 'Every field of `status` and `safe-time`, not only the summary and compact table'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from trx-status" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from trx-status" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from binlog" -l from-gtid -d 'Start at this gtid' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from binlog" -l limit -d 'At most this many entries' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from binlog" -l socket -d 'The daemon\'s admin socket' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from binlog" -l timeout -d 'Give up on an answer after this long (added to `--wait` for `trx-status`)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from binlog" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from binlog" -l json -d 'Print the API\'s JSON answer (pretty on a terminal, one line otherwise)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from binlog" -l wide -d 'Every field of `status` and `safe-time`, not only the summary and compact table'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from binlog" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from binlog" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from promote" -l socket -d 'The daemon\'s admin socket' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from promote" -l timeout -d 'Give up on an answer after this long (added to `--wait` for `trx-status`)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from promote" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from promote" -l yes -d 'Promote without asking'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from promote" -l json -d 'Print the API\'s JSON answer (pretty on a terminal, one line otherwise)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from promote" -l wide -d 'Every field of `status` and `safe-time`, not only the summary and compact table'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from promote" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from promote" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from pause" -l tablet -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from pause" -l socket -d 'The daemon\'s admin socket' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from pause" -l timeout -d 'Give up on an answer after this long (added to `--wait` for `trx-status`)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from pause" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from pause" -l json -d 'Print the API\'s JSON answer (pretty on a terminal, one line otherwise)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from pause" -l wide -d 'Every field of `status` and `safe-time`, not only the summary and compact table'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from pause" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from pause" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from resume" -l tablet -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from resume" -l socket -d 'The daemon\'s admin socket' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from resume" -l timeout -d 'Give up on an answer after this long (added to `--wait` for `trx-status`)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from resume" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from resume" -l json -d 'Print the API\'s JSON answer (pretty on a terminal, one line otherwise)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from resume" -l wide -d 'Every field of `status` and `safe-time`, not only the summary and compact table'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from resume" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from resume" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from metrics" -l socket -d 'The daemon\'s admin socket' -r -F
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from metrics" -l timeout -d 'Give up on an answer after this long (added to `--wait` for `trx-status`)' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from metrics" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from metrics" -l json -d 'Print the API\'s JSON answer (pretty on a terminal, one line otherwise)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from metrics" -l wide -d 'Every field of `status` and `safe-time`, not only the summary and compact table'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from metrics" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from metrics" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from help" -f -a "status" -d 'Role, safe time and per-tablet positions and state'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from help" -f -a "safe-time" -d 'Global and per-tablet safe time and lag'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from help" -f -a "get" -d 'Read one key (consistent at safe time by default)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from help" -f -a "scan" -d 'Read the keys starting with PREFIX'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from help" -f -a "trx-status" -d 'Did transaction TRX (`connect_id:counter`) commit?'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from help" -f -a "binlog" -d 'Commits in commit order'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from help" -f -a "promote" -d 'Promote the target to primary at a clean cut (irreversible: needs --yes, or the word `promote` typed on a terminal)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from help" -f -a "pause" -d 'Stop shipping (shipper) or intake (applier), for all tablets or one'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from help" -f -a "resume" -d 'Undo `pause`'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from help" -f -a "metrics" -d 'Prometheus metrics, as is (with --json: parsed, one object per family)'
complete -c tidelog -n "__fish_tidelog_using_subcommand ctl; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tidelog -n "__fish_tidelog_using_subcommand generate" -l log-level -d 'Log filter for diagnostics on stderr (e.g. `info`, `debug`, `tidelog_wal=debug,warn`). Overrides RUST_LOG, which overrides the daemons\' `log-level` config key; without any, daemons log at `info` and the other commands warnings and errors only' -r
complete -c tidelog -n "__fish_tidelog_using_subcommand generate" -s h -l help -d 'Print help'
complete -c tidelog -n "__fish_tidelog_using_subcommand generate" -s V -l version -d 'Print version'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and not __fish_seen_subcommand_from apply ship demo wal certs ctl generate help" -f -a "apply" -d 'Run the applier daemon (target side): QUIC intake, apply, admin API'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and not __fish_seen_subcommand_from apply ship demo wal certs ctl generate help" -f -a "ship" -d 'Run the shipper daemon (source side): tail the WALs and ship them'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and not __fish_seen_subcommand_from apply ship demo wal certs ctl generate help" -f -a "demo" -d 'Everything on one machine: applier, shipper and a bank workload, with consistency checks'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and not __fish_seen_subcommand_from apply ship demo wal certs ctl generate help" -f -a "wal" -d 'Inspect, verify and write tablet WALs (`dump`, `append`, `check`)'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and not __fish_seen_subcommand_from apply ship demo wal certs ctl generate help" -f -a "certs" -d 'Create the CA and the mTLS certificates of both daemons'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and not __fish_seen_subcommand_from apply ship demo wal certs ctl generate help" -f -a "ctl" -d 'Talk to a running daemon through its admin socket'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and not __fish_seen_subcommand_from apply ship demo wal certs ctl generate help" -f -a "generate" -d 'Write the man pages or the shell completions (for packaging)'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and not __fish_seen_subcommand_from apply ship demo wal certs ctl generate help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and __fish_seen_subcommand_from wal" -f -a "dump" -d 'Print records as JSON lines on stdout'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and __fish_seen_subcommand_from wal" -f -a "append" -d 'Append records given as JSON lines on stdin, one commit per line'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and __fish_seen_subcommand_from wal" -f -a "check" -d 'Verify every segment and record; print a summary line per tablet'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and __fish_seen_subcommand_from certs" -f -a "init" -d 'Write ca.pem ca.key applier.pem applier.key shipper.pem shipper.key into DIR (keys mode 0600). The applier certificate names localhost, 127.0.0.1 and every --san'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and __fish_seen_subcommand_from ctl" -f -a "status" -d 'Role, safe time and per-tablet positions and state'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and __fish_seen_subcommand_from ctl" -f -a "safe-time" -d 'Global and per-tablet safe time and lag'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and __fish_seen_subcommand_from ctl" -f -a "get" -d 'Read one key (consistent at safe time by default)'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and __fish_seen_subcommand_from ctl" -f -a "scan" -d 'Read the keys starting with PREFIX'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and __fish_seen_subcommand_from ctl" -f -a "trx-status" -d 'Did transaction TRX (`connect_id:counter`) commit?'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and __fish_seen_subcommand_from ctl" -f -a "binlog" -d 'Commits in commit order'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and __fish_seen_subcommand_from ctl" -f -a "promote" -d 'Promote the target to primary at a clean cut (irreversible: needs --yes, or the word `promote` typed on a terminal)'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and __fish_seen_subcommand_from ctl" -f -a "pause" -d 'Stop shipping (shipper) or intake (applier), for all tablets or one'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and __fish_seen_subcommand_from ctl" -f -a "resume" -d 'Undo `pause`'
complete -c tidelog -n "__fish_tidelog_using_subcommand help; and __fish_seen_subcommand_from ctl" -f -a "metrics" -d 'Prometheus metrics, as is (with --json: parsed, one object per family)'
