//! Read-only views: `status`, `runs list`.

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

pub async fn runs_list(target: &Target, trigger: Option<&str>, limit: i64) -> Result<(), CliError> {
    let client = connect::connect_target(target).await?;
    for r in status::list_runs(&client, trigger, limit).await? {
        println!("{r}");
    }
    Ok(())
}
