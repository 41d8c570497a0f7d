//! `herald-bench`: Herald measured end to end through its public
//! interfaces (the HTTP API, the store traits), with a receiver in this
//! process. Kept out of the `herald` binary so a release carries no
//! benchmark. Options and the figures they give: BENCHMARKS.md.

mod bench;
mod claim_cost;
mod engine;
mod reads;
mod receiver;

use clap::Parser;

#[derive(Parser)]
#[command(name = "herald-bench", version, about = "Measures Herald end to end")]
struct Cli {
    #[command(flatten)]
    args: bench::BenchArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    bench::run(cli.args).await
}
