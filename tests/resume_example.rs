//! Runs `examples/order_workflow_resume.rs` (built with the tests): its caller is killed in each
//! step in turn and a worker process finishes the order; every step's effect once.

#[cfg(feature = "sqlite")]
#[test]
fn the_order_workflow_finishes_after_a_kill_in_each_step() {
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples")
        .join(format!(
            "order_workflow_resume{}",
            std::env::consts::EXE_SUFFIX
        ));
    let out = std::process::Command::new(&example)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (built by `cargo test`)", example.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (order, _) in [(1, "reserve"), (2, "charge"), (3, "ship")] {
        for step in ["reserve", "charge", "ship"] {
            let effect = match step {
                "reserve" => format!("reserve: done (reservation R-{order})"),
                "charge" => format!("charge: done (payment P-{order})"),
                _ => format!("ship: done (parcel S-{order})"),
            };
            assert_eq!(text.matches(&effect).count(), 1, "{effect} once:\n{text}");
        }
        assert!(
            text.contains(&format!("a retry by the caller replays: S-{order}")),
            "{text}"
        );
    }
    // The worker ran only what the caller had not finished: order 3 was killed in `ship`, so
    // its worker's lines are the ship step's alone.
    let order3 = text.split("order 3:").nth(1).unwrap();
    let worker = order3.split("a worker process resumes").nth(1).unwrap();
    assert!(
        !worker.contains("reserve:") && !worker.contains("charge:"),
        "{worker}"
    );
}
