//! Learning through the datapath, the queue and the keeper, with fake
//! ports (frames in a `Vec`, outputs recorded) and a test clock: the
//! engine's path minus its threads and sockets.

use std::sync::Arc;

use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::{
    Datapath, DatapathConfig, DatapathSink, DpPacket, PacketIn, TunnelMeta,
};
use oxvs_pipeline::flow::FlowModCommand;
use oxvs_pipeline::learn::Learned;
use oxvs_pipeline::parse::{parse_flow_file, parse_flow_mod, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::XlateEnv;

use super::*;

const S: u64 = 1_000_000_000;

/// Antrea's session affinity in small: ServiceLB (40) learns, for a new
/// client, a flow in SessionAffinity (36) that marks its later packets
/// (`reg0[20]`), which ServiceLB then sends to port 3 instead of 2.
const FLOWS: &str = "
table=0,priority=100,tcp,nw_dst=10.96.0.1,tp_dst=80 actions=resubmit(,36),resubmit(,40)
table=40,priority=200,tcp,reg0=0x100000/0x100000 actions=output:3
table=40,priority=100,tcp actions=learn(table=36,hard_timeout=300,priority=200,delete_learned,cookie=0x7000000000001,eth_type=0x800,nw_proto=6,NXM_OF_TCP_DST[],NXM_OF_IP_DST[],NXM_OF_IP_SRC[],load:0x1->NXM_NX_REG0[20]),output:2
";

/// The engine's sink, without ports: outputs recorded, learned flows
/// collected per batch as the engine's scratch list does.
#[derive(Default)]
struct FakePorts {
    outputs: Vec<u32>,
    learns: Vec<Arc<Learned>>,
}

impl DatapathSink for FakePorts {
    fn output(&mut self, port: u32, _frame: &[u8], _tunnel: Option<TunnelMeta>) {
        self.outputs.push(port);
    }
    fn packet_in(&mut self, _pkt: PacketIn<'_>) {}
    fn learn(&mut self, flow: &Arc<Learned>) {
        self.learns.push(Arc::clone(flow));
    }
}

/// A TCP SYN from `src` to 10.96.0.1:80.
fn syn(src: [u8; 4], sport: u16) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend_from_slice(&[0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[10, 96, 0, 1]);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&80u16.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    f
}

struct Rig {
    pipeline: Arc<Pipeline>,
    dp: Datapath,
    ct: Conntrack,
    ports: FakePorts,
    queue: Arc<LearnQueue>,
    keeper: FlowKeeper,
}

impl Rig {
    fn new(queue_max: usize) -> Rig {
        let pipeline = Arc::new(Pipeline::new());
        let flows = parse_flow_file(FLOWS, &ParseContext::default()).expect("flows parse");
        pipeline.replace_all(&flows, 0).expect("flows load");
        let dp = Datapath::new(
            Arc::clone(&pipeline),
            XlateEnv::with_ports(vec![1, 2, 3]),
            DatapathConfig::default(),
        );
        let queue = Arc::new(LearnQueue::new(queue_max));
        let keeper = FlowKeeper::new(Arc::clone(&queue), Arc::clone(&pipeline));
        Rig {
            pipeline,
            dp,
            ct: Conntrack::new(CtConfig::default()),
            ports: FakePorts::default(),
            queue,
            keeper,
        }
    }

    /// One batch from port 1 at `now`, then its learned flows queued (as
    /// the engine does after a batch); the ports each packet went out of.
    fn batch(&mut self, frames: &[Vec<u8>], now: u64) -> Vec<u32> {
        let mut pkts: Vec<_> = frames.iter().map(|f| DpPacket::from_frame(f, 1)).collect();
        self.ports.outputs.clear();
        self.dp
            .process_batch(&mut pkts, &mut self.ct, now, &mut self.ports);
        self.queue.push_batch(&mut self.ports.learns);
        self.ports.outputs.clone()
    }

    fn learned(&self) -> Vec<String> {
        let t = self.pipeline.snapshot();
        t.flows_in(36)
            .iter()
            .map(|r| oxvs_pipeline::print::format_flow(&r.flow, None))
            .collect()
    }
}

#[test]
fn a_packet_learns_a_flow_that_the_next_packet_matches_until_its_hard_timeout() {
    let mut r = Rig::new(16);
    let a = syn([10, 0, 0, 5], 1000);
    // First packet: no affinity yet, so port 2, and the flow is learned.
    assert_eq!(r.batch(std::slice::from_ref(&a), S), vec![2]);
    assert_eq!(r.queue.len(), 1);
    r.keeper.tick(S);
    assert_eq!(
        r.learned(),
        vec![
            "cookie=0x7000000000001, table=36, hard_timeout=300, priority=200,tcp,nw_src=10.0.0.5,nw_dst=10.96.0.1,tp_dst=80 actions=load:0x1->NXM_NX_REG0[20]"
        ]
    );
    assert_eq!(r.queue.stats().learned, 1);
    // The next packet of that client (another connection) matches it.
    assert_eq!(r.batch(&[syn([10, 0, 0, 5], 1001)], 2 * S), vec![3]);
    // Another client learns its own, from its own address.
    assert_eq!(r.batch(&[syn([10, 0, 0, 6], 1000)], 3 * S), vec![2]);
    r.keeper.tick(3 * S);
    assert_eq!(r.learned().len(), 2);
    // The first one's hard timeout passes (300 s after it was learned at
    // 1 s): it goes, the second stays.
    r.keeper.tick(300 * S);
    assert_eq!(r.learned().len(), 2);
    r.keeper.tick(301 * S);
    assert_eq!(r.learned().len(), 1);
    assert_eq!(r.queue.stats().flows_expired, 1);
    assert_eq!(r.batch(&[a], 302 * S), vec![2], "no affinity any more");
    r.keeper.tick(302 * S);
    assert_eq!(r.learned().len(), 2, "learned again");
}

#[test]
fn a_cached_learn_learns_with_each_megaflows_values_and_refreshes() {
    let mut r = Rig::new(16);
    // Two packets of one client in a batch: one megaflow, one learned flow
    // (the second is within the resend interval).
    let out = r.batch(&[syn([10, 0, 0, 5], 1000), syn([10, 0, 0, 5], 1002)], S);
    assert_eq!(out, vec![2, 2]);
    assert_eq!(r.queue.len(), 1);
    // The megaflow matches the learn's sources: another client in the same
    // batch gets a megaflow, and a learned flow, of its own.
    r.batch(&[syn([10, 0, 0, 7], 1000)], S);
    assert_eq!(r.queue.len(), 2);
    r.keeper.tick(S);
    assert_eq!(r.learned().len(), 2);
    assert!(
        r.learned()[1].contains("nw_src=10.0.0.7") || r.learned()[0].contains("nw_src=10.0.0.7")
    );
    // Learning the same flow again refreshes it: the hard timeout counts
    // from then, no new table version.
    let generation = r.pipeline.snapshot().generation();
    let flow = r.pipeline.snapshot().flows_in(36)[0].flow.clone();
    let again = Arc::new(Learned::new(flow));
    r.queue.push_batch(&mut vec![again]);
    r.keeper.tick(200 * S);
    assert_eq!(r.queue.stats().learn_refreshed, 1);
    assert_eq!(r.pipeline.snapshot().generation(), generation);
    r.keeper.tick(301 * S);
    assert_eq!(r.learned().len(), 1, "the refreshed one stays");
    r.keeper.tick(500 * S);
    assert_eq!(r.learned().len(), 0);
}

#[test]
fn deleting_the_learner_deletes_what_it_learned() {
    let mut r = Rig::new(16);
    r.batch(&[syn([10, 0, 0, 5], 1000), syn([10, 0, 0, 6], 1000)], S);
    r.keeper.tick(S);
    assert_eq!(r.learned().len(), 2);
    let del = parse_flow_mod(
        "table=40,priority=100,tcp",
        FlowModCommand::Delete { strict: true },
        &ParseContext::default(),
    )
    .expect("del parses");
    let rep = r.pipeline.apply(&[del], 2 * S).expect("delete applies");
    assert_eq!(rep.deleted, 3, "the learner and its two flows");
    assert!(r.learned().is_empty());
}

#[test]
fn a_full_queue_drops_and_counts() {
    let mut r = Rig::new(2);
    let frames: Vec<Vec<u8>> = (1..=5).map(|i| syn([10, 0, 1, i], 1000)).collect();
    r.batch(&frames, S);
    assert_eq!(r.queue.len(), 2);
    assert_eq!(r.queue.stats().learn_dropped, 3);
    r.keeper.tick(S);
    assert_eq!(r.learned().len(), 2);
    assert!(r.queue.is_empty());
    // The dropped ones are learned again by their next packets once the
    // resend interval has passed (their megaflows are gone anyway: the
    // table changed).
    r.batch(&frames, 2 * S);
    r.keeper.tick(2 * S);
    assert!(r.learned().len() >= 4, "{:?}", r.learned());
}

#[test]
fn the_keeper_thread_applies_and_stops() {
    let pipeline = Arc::new(Pipeline::new());
    let queue = Arc::new(LearnQueue::new(8));
    let keeper = FlowKeeper::new(Arc::clone(&queue), Arc::clone(&pipeline));
    let h = std::thread::spawn(move || keeper.run(|| 5 * S));
    let flow = oxvs_pipeline::parse::parse_flow(
        "table=7,priority=5,reg0=1 actions=output:2",
        &ParseContext::default(),
    )
    .expect("parses");
    queue.push_batch(&mut vec![Arc::new(Learned::new(flow))]);
    let t0 = std::time::Instant::now();
    while pipeline.snapshot().flows_in(7).is_empty() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(5),
            "not applied"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    queue.stop();
    h.join().expect("keeper thread ends");
}
