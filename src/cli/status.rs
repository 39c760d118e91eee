//! `qlsched status`: replicas, claims, backlog, runs by kind, retention.

use super::connect::{self, Target};
use super::error::CliError;
use crate::store::status;

pub async fn status(target: &Target, json: bool, last: i64) -> Result<(), CliError> {
    let client = connect::connect_target(target).await?;
    let s = status::read(&client, last).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", s.render());
    }
    Ok(())
}
