//! The peers' common workload: a small receipt, and `agent-effects` running a no-op effect on
//! whichever of its stores a bench gives it.

use agent_effects::{EffectFailure, EffectOutcome, EffectStore, Runtime};
use std::hint::black_box;

/// What every variant returns.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    pub id: u64,
    pub amount: u64,
}

/// One `agent-effects` call keyed by `order` (`Runtime::effect(..).run(..)`); a key it has
/// committed before is replayed.
pub async fn with_agent_effects<S: EffectStore>(runtime: &Runtime<S>, order: u64) -> Receipt {
    let out = runtime
        .effect("bench", order)
        .input(&order)
        .run(move |_| async move {
            Ok::<_, EffectFailure>(Receipt {
                id: black_box(order),
                amount: 100,
            })
        })
        .await
        .unwrap();
    match out {
        EffectOutcome::Committed(r) => r,
        other => panic!("agent-effects: {other:?}"),
    }
}
