// Package plugin is how a node runs a task: the Plugin interface, a
// Registry from queue constructor names to plugins, Run (which applies a
// timeout and turns every kind of plugin misbehaviour into a failed task),
// and the built-in plugins:
//
//   - Demo ("Disbatch::Plugin::Demo"), the Disbatch 4.103 demo plugin;
//   - Exec ("exec"), a command with arguments, without a shell;
//   - Shell ("shell"), bash -c;
//   - External(path, args...), an executable that speaks JSON on stdin and
//     stdout, like Disbatch's task runner.
//
// The package never touches MongoDB: the node reads the task, calls Run and
// writes the Result.
//
// Process plugins (Exec, Shell, External) start each command in its own
// process group and, when the task's context is done (timeout or node
// shutdown), SIGKILL the whole group, so children of the command die with it.
// Their stdout and stderr are each captured up to MaxOutput bytes.
//
// Exec and Shell run whatever a task asks for with the node's privileges:
// register them only where whoever can insert tasks may run commands.
package plugin
