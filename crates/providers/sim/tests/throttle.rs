//! The sim's throttling never lets more than `burst + qps·t` calls through in any window of
//! length `t`, globally and per operation. Paused tokio time: no sleeping, no timing flakes.

use std::time::Duration;

use ccm_cloud::{CloudError, LoadBalancer, Routes, op};
use ccm_provider_sim::fixtures::service;
use ccm_provider_sim::{SimCloud, Throttle};
use proptest::prelude::*;
use tokio::time::Instant;

fn check_windows(grants: &[Instant], qps: f64, burst: u32) -> Result<(), TestCaseError> {
    for (i, first) in grants.iter().enumerate() {
        for (j, last) in grants.iter().enumerate().skip(i) {
            let t = last.duration_since(*first).as_secs_f64();
            let n = (j - i + 1) as f64;
            prop_assert!(
                n <= f64::from(burst) + qps * t + 1e-6,
                "{} calls through in {}s with qps {} burst {}",
                n,
                t,
                qps,
                burst
            );
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn never_more_than_burst_plus_rate(
        global_qps in 1.0f64..100.0,
        global_burst in 1u32..20,
        op_qps in 0.5f64..50.0,
        op_burst in 1u32..10,
        calls in proptest::collection::vec((0u64..300, any::<bool>()), 1..300),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        rt.block_on(async {
            let sim = SimCloud::seeded(1);
            sim.set_throttle("*", Some(Throttle { qps: global_qps, burst: global_burst }))
                .expect("op");
            sim.set_throttle(op::LIST_ROUTES, Some(Throttle { qps: op_qps, burst: op_burst }))
                .expect("op");
            let svc = service("ns", "s", "u", &[("TCP", 80, 30080)]);
            let mut all = Vec::new();
            let mut listed = Vec::new();
            let mut throttled = 0u64;
            for (gap_ms, list) in calls {
                tokio::time::advance(Duration::from_millis(gap_ms)).await;
                let now = Instant::now();
                let result = if list {
                    sim.list_routes("c").await.map(drop)
                } else {
                    sim.get_load_balancer("c", &svc).await.map(drop)
                };
                match result {
                    Ok(()) => {
                        all.push(now);
                        if list {
                            listed.push(now);
                        }
                    }
                    Err(CloudError::Throttled { message, retry_after }) => {
                        prop_assert!(message.starts_with("RequestLimitExceeded"));
                        prop_assert!(retry_after.is_some());
                        throttled += 1;
                    }
                    Err(e) => prop_assert!(false, "unexpected {e:?}"),
                }
            }
            check_windows(&all, global_qps, global_burst)?;
            check_windows(&listed, op_qps, op_burst)?;
            let counted: u64 = sim
                .calls()
                .iter()
                .filter(|((_, result), _)| result == "throttled")
                .map(|(_, n)| n)
                .sum();
            prop_assert_eq!(counted, throttled, "throttled calls are accounted");
            Ok(())
        })?;
    }
}

/// A steady caller slower than the limit is never throttled (the limit is not too strict).
#[tokio::test(start_paused = true)]
async fn callers_under_the_limit_pass() {
    let sim = SimCloud::seeded(1);
    sim.set_throttle(
        "*",
        Some(Throttle {
            qps: 10.0,
            burst: 1,
        }),
    )
    .expect("op");
    for _ in 0..100 {
        sim.list_routes("c").await.expect("under the limit");
        tokio::time::advance(Duration::from_millis(100)).await;
    }
}
