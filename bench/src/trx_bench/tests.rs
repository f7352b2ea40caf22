use super::*;

#[test]
fn the_generator_replays_and_places_commits() {
    let m = Manifest {
        version: MANIFEST_VERSION,
        commits: 5000,
        tablets: 4,
        sessions: 16,
        distributed_pct: 10.0,
        abort_pct: 5.0,
        seed: 7,
        connect_base: 1 << 56,
        first_ht: 1,
        last_ht: 0,
        records: 0,
        aborts: 0,
        distributed: 0,
        build_s: 0.0,
    };
    let a = replay(&m);
    let b = replay(&m);
    assert_eq!(a.table, b.table);
    assert_eq!(a.table.len(), 5000);
    // Every session's commits are numbered 1, 2, 3… in order.
    let mut next = [1u32; 16];
    for (s, c) in &a.table {
        assert_eq!(*c, next[*s as usize]);
        next[*s as usize] += 1;
    }
    let mut r = Rng(1);
    assert!((0..1000).all(|_| r.below(3) < 3));
}
